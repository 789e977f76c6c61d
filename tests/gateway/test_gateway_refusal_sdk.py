"""R-GW-6a through a real `ledger serve`: the official Python SDKs with their default retries raise
at once on a refusal whose retry time is an hour away, and do retry one that frees within 60 s.

The SDKs' retry sleep is recorded instead of slept (their module's `time`, nothing else), so the
test reads what each SDK decided (how long it would wait, how often it came back) from the
requests the service saw, not from a clock: without `x-should-retry: false` the Anthropic SDK
asks to sleep the whole Retry-After (3600 s) twice, and the service sees three refusals."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import openai
import pytest
from anthropic import _base_client as anthropic_base
from openai import _base_client as openai_base

from tests.support.gateway_setup import Gateway
from tests.support.refusal_setup import (
    CHAT,
    MESSAGES,
    SCOPE,
    cool_every_provider,
    refused_seen,
    refusing_gateway,
)

MESSAGE = [{"role": "user", "content": "hi"}]
LONG_WAIT_S = 60  # R-GW-6a: a longer wait says `x-should-retry: false`


def _record_sleeps(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[float]:
    """The SDK module's `time.sleep` records its argument and returns at once."""
    asked: list[float] = []
    fake = SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
    fake.sleep = asked.append
    monkeypatch.setattr(module, "time", fake)
    return asked


def _openai_call(gw: Gateway, key: str) -> Callable[[], Any]:
    client = openai.OpenAI(base_url=gw.url + "/openai/v1", api_key=key, timeout=60)
    gw.clients.append(client)  # default max_retries (2): what a user runs
    return lambda: client.chat.completions.create(model="acme/a1", messages=MESSAGE)  # type: ignore[arg-type]


def _anthropic_call(gw: Gateway, key: str) -> Callable[[], Any]:
    client = anthropic.Anthropic(base_url=gw.url + "/anthropic", api_key=key, timeout=60)
    gw.clients.append(client)
    return lambda: client.messages.create(model="bolt/b1", max_tokens=16, messages=MESSAGE)  # type: ignore[arg-type]


SDKS = [
    pytest.param(openai_base, _openai_call, openai.RateLimitError, CHAT, id="openai"),
    pytest.param(anthropic_base, _anthropic_call, anthropic.RateLimitError, MESSAGES,
                 id="anthropic"),
]  # fmt: skip


@pytest.mark.parametrize(("module", "make_call", "error", "route"), SDKS)
def test_r_gw_6a_a_refusal_an_hour_away_is_raised_at_once_by_the_python_sdks(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    make_call: Callable[[Gateway, str], Callable[[], Any]],
    error: type[Exception],
    route: str,
) -> None:
    asked = _record_sleeps(monkeypatch, module)
    with refusing_gateway(home) as (gw, key):
        with pytest.raises(error) as raised:
            make_call(gw, key)()
        assert refused_seen(gw, route) == 1  # the SDK never came back
        assert asked == []  # nor meant to, after a sleep
        response = raised.value.response  # type: ignore[attr-defined]
        assert response.headers["x-should-retry"] == "false"
        assert int(response.headers["retry-after"]) > 3000
        text = response.text
        assert f"refused: scope_hourly_budget for scope {SCOPE}; retry after 20" in text
        assert " s)" in text
        assert "callsPerHour\": 1" not in text


@pytest.mark.parametrize(("module", "make_call", "error", "route"), SDKS)
def test_r_gw_6a_a_refusal_within_a_minute_is_retried_by_the_python_sdks(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    make_call: Callable[[Gateway, str], Callable[[], Any]],
    error: type[Exception],
    route: str,
) -> None:
    asked = _record_sleeps(monkeypatch, module)
    with refusing_gateway(home) as (gw, _):
        cool_every_provider(gw)
        with pytest.raises(error) as raised:
            make_call(gw, gw.token)()  # the service token: no scope in the way
        assert refused_seen(gw, route) == 3  # the first answer and both default retries
        assert len(asked) == 2
        assert all(0 < wait <= 30 for wait in asked)
        response = raised.value.response  # type: ignore[attr-defined]
        assert "x-should-retry" not in response.headers
        assert 0 < int(response.headers["retry-after"]) <= LONG_WAIT_S
        assert "refused: provider_cooldown for provider " in response.text
