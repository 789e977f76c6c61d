"""The gateway over the routing and scope rules (R-GW-2 with R-RT-3, R-RT-5 and R-SC-1/R-SC-3):
a pool key through a real `ledger serve` is spread by the reserve's own choice, a route's effort
reaches the wire, and a gateway key's scopes bound its requests."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from ledger.standin.server import StandIn
from tests.support.gateway_setup import gateway

HELLO: Any = [{"role": "user", "content": "hello"}]  # the SDKs' own message types


def test_r_rt_5_r_gw_2_a_pool_key_is_spread_round_robin_and_names_the_concrete_model(
    home: Path,
) -> None:
    pools = {"p": {"candidates": ["acme/a1", "cirrus/c1"], "strategy": "round-robin"}}
    with StandIn() as standin, gateway(home, standin, pools=pools) as gw:
        client = gw.openai()
        answered = []
        for _ in range(6):
            raw = client.chat.completions.with_raw_response.create(model="pool/p", messages=HELLO)
            answered.append(raw.parse().model)
            assert raw.headers["x-ledger-model"] == raw.parse().model
            assert "x-ledger-fallback-from" not in raw.headers  # the pool's pick is no fallback
        asked = Counter(gw.models_asked())
    assert Counter(answered) == {"acme/a1": 3, "cirrus/c1": 3}
    assert asked == {"a1": 3, "c1": 3}


def test_r_rt_3_r_gw_3_a_routes_effort_reaches_the_wire_and_no_other(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        gw.openai().chat.completions.create(model="acme/a1:high", messages=HELLO)
        gw.openai().chat.completions.create(model="acme/a1", messages=HELLO)
        gw.anthropic().messages.create(model="bolt/b1:medium", max_tokens=4096, messages=HELLO)
        bodies = standin.bodies
    assert bodies[0]["reasoning_effort"] == "high"
    assert "reasoning_effort" not in bodies[1]  # no effort on the route: none sent
    thinking = bodies[2]["thinking"]
    assert thinking["type"] == "enabled"
    assert 1024 <= thinking["budget_tokens"] < bodies[2]["max_tokens"]


def _key(home: Path, *args: str) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "key", "create", *args],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return made.stdout.strip()


def test_r_sc_1_r_sc_3_a_gateway_keys_scope_bounds_its_requests(home: Path) -> None:
    scopes = {"nightly": {"callsPerHour": 2}}
    with StandIn() as standin, gateway(home, standin, scopes=scopes) as gw:
        key = _key(home, "night-jobs", "--scope", "nightly")
        keyed = openai.OpenAI(base_url=gw.url + "/openai/v1", api_key=key, max_retries=0)
        try:
            for _ in range(2):
                keyed.chat.completions.create(model="acme/a1", messages=HELLO)
            with pytest.raises(openai.RateLimitError) as refused:
                keyed.chat.completions.create(model="acme/a1", messages=HELLO)
            # the service token is under no scope: the global budget still has room
            gw.openai().chat.completions.create(model="acme/a1", messages=HELLO)
        finally:
            keyed.close()
        asked = len(standin.requests)
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "scope_hourly_budget"
    assert refused.value.response.headers.get("retry-after") is not None
    assert asked == 3  # the refused request never went upstream
    assert key not in (home / "ledger.db").read_bytes().decode("latin-1")


def test_r_rt_5_r_gw_3_a_pool_of_both_formats_serves_the_common_subset(home: Path) -> None:
    """Before: a pool whose candidates spoke both formats was never routable, so a request
    naming it was answered by the selection's next route, a model outside the pool."""
    pools = {"mix": {"candidates": ["acme/a1", "bolt/b1"], "strategy": "round-robin"}}
    with StandIn() as standin, gateway(home, standin, pools=pools) as gw:
        answered = [
            gw.openai().chat.completions.create(model="pool/mix", messages=HELLO).model
            for _ in range(4)
        ]
        translated = gw.anthropic().messages.create(model="pool/mix", max_tokens=64,
                                                    messages=HELLO).model  # fmt: skip
        paths = [r.path for r in standin.requests]
        # outside the common subset (logprobs): the Anthropic candidate cannot serve it, so
        # neither can the pool (the reserve picks among all its candidates)
        outside = httpx.post(gw.url + "/openai/v1/chat/completions", timeout=30,
                             headers={"authorization": f"Bearer {gw.token}"},
                             json={"model": "pool/mix", "messages": HELLO,
                                   "logprobs": True})  # fmt: skip
    assert Counter(answered) == {"acme/a1": 2, "bolt/b1": 2}
    assert translated in ("acme/a1", "bolt/b1")
    assert Counter(paths) == {"/v1/chat/completions": 2 + (translated == "acme/a1"),
                              "/v1/messages": 2 + (translated == "bolt/b1")}  # fmt: skip
    # like a named model of the other format: the selection's next route, marked as a fallback
    assert outside.status_code == 200
    assert outside.headers["x-ledger-fallback-from"] == "pool/mix"
    assert outside.headers["x-ledger-model"] != "bolt/b1"
