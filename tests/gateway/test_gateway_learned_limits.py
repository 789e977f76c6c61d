"""R-TOK-4 through a real `ledger serve`: the rate-limit headers on the gateway's upstream answers
(success or failure, streamed or not) are kept in the ledger, so every process is refused what the
provider said is not left: the gateway (429 `provider_tokens_exhausted` with Retry-After), the
library in this process, `/v1` (`LedgerClient`) and the CLI, until the reset; a backup with room
serves the request when the policy allows one.

`replyTokens` 1500: a reservation with no input estimates 1,500 tokens; the stand-in's first
answer says `x-ratelimit-remaining-tokens: 1200` and `x-ratelimit-reset-tokens: 20s`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger.api import Ledger
from ledger.client import LedgerClient
from ledger.clock import now_ms
from ledger.errors import Refused
from ledger.kinds import RefusalReason
from ledger.standin.server import Scripted, StandIn
from tests.support.backends import rows, write
from tests.support.gateway_setup import gateway
from tests.support.queue_setup import ROOT, cli_env

EXHAUSTED = RefusalReason.PROVIDER_TOKENS_EXHAUSTED
HEARD = Scripted(tokens_remaining=1200, tokens_reset_s=20)
POLICY: dict[str, Any] = {"callsPerHour": 1000, "sourceCalls": 1000, "replyTokens": 1500}
CHAT = {"model": "acme/a1", "messages": [{"role": "user", "content": "hello"}]}


def _post(gw: Any, stream: bool = False) -> httpx.Response:
    return httpx.post(gw.url + "/openai/v1/chat/completions", json={**CHAT, "stream": stream},
                      headers={"authorization": f"Bearer {gw.token}"}, timeout=60)  # fmt: skip


def _reading(home: Path) -> tuple[int, int]:
    ((remaining, reset),) = rows(f"sqlite:///{home / 'ledger.db'}",
                                 "SELECT remaining, reset_ms FROM learned_limits"
                                 " WHERE provider = 'acme' AND model_id = 'a1'")  # fmt: skip
    return int(remaining), int(reset)


def _cli_reserve(home: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "ledger", "--home", str(home), "reserve", "cli",
            "--model", "acme/a1", "--json"]  # fmt: skip
    return subprocess.run(argv, cwd=ROOT, env=cli_env(), capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_r_tok_4_every_process_is_refused_until_the_reset(tmp_path: Path, stream: bool) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    with StandIn() as standin, gateway(home, standin, crossProviderFallback=False,
                                       **POLICY) as gw:  # fmt: skip
        standin.set_script("a1", [HEARD])
        first = _post(gw, stream)
        assert first.status_code == 200, first.text
        remaining, reset = _reading(home)
        assert remaining == 1200
        second = _post(gw, stream)
        assert second.status_code == 429, second.text
        error = second.json()["error"]
        assert error["code"] == EXHAUSTED
        assert "model acme/a1" in error["message"]
        assert 15 <= int(second.headers["retry-after"]) <= 21
        assert len(standin.requests) == 1  # the refused request never reached the provider
        # the library, in this process: the same reading, the same retry time
        led = Ledger.open(home, env={})
        with pytest.raises(Refused) as info:
            led.reserve("lib", "acme/a1")
        led.close()
        assert (info.value.reason, info.value.retry_at_ms) == (EXHAUSTED, reset)
        assert info.value.detail == "tokens remaining 1200 of model acme/a1"
        # /v1, through the service's own socket
        with LedgerClient(gw.served.socket) as client, pytest.raises(Refused) as info:
            client.reserve("v1", "acme/a1")
        assert (info.value.reason, info.value.retry_at_ms) == (EXHAUSTED, reset)
        # the CLI: exit 3 with the reason and the retry time
        cli = _cli_reserve(home)
        assert cli.returncode == 3, cli.stderr
        assert EXHAUSTED in cli.stdout + cli.stderr
        # the reset brought near (rather than waiting 20 s): granted again after it
        write(f"sqlite:///{home / 'ledger.db'}", "UPDATE learned_limits SET reset_ms = :at",
              at=now_ms() + 300)
        time.sleep(0.5)
        third = _post(gw, stream)
        assert third.status_code == 200, third.text
        assert len(standin.requests) == 2


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_r_tok_4_a_failed_answer_is_learned_too(tmp_path: Path, stream: bool) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    failing = Scripted(status=500, tokens_remaining=0, tokens_reset_s=30)
    with StandIn(default=failing, tokens_per_minute=None) as standin, \
            gateway(home, standin, crossProviderFallback=False, **POLICY) as gw:
        answer = _post(gw, stream)
        assert answer.status_code >= 500
        remaining, reset = _reading(home)
    assert remaining == 0
    assert 0 < reset - now_ms() <= 30_000


def test_r_tok_4_a_backup_with_room_serves_the_request(tmp_path: Path) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    with StandIn() as standin, gateway(home, standin, **POLICY) as gw:
        standin.set_script("a1", [HEARD])
        assert _post(gw).status_code == 200
        second = _post(gw)
    assert second.status_code == 200, second.text
    assert second.headers["x-ledger-model"] == "cirrus/c1"  # a1 had no room: its backup
    assert [r.model for r in standin.requests] == ["a1", "c1"]


def test_r_tok_4_learn_limits_false_sends_it_on(tmp_path: Path) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    with StandIn() as standin, gateway(home, standin, learnLimits=False, **POLICY) as gw:
        standin.set_script("a1", [HEARD])
        assert _post(gw).status_code == 200
        second = _post(gw)
    assert second.status_code == 200, second.text
    assert second.headers["x-ledger-model"] == "acme/a1"
    assert rows(f"sqlite:///{home / 'ledger.db'}", "SELECT count(*) FROM learned_limits") == [(0,)]


def test_r_tok_4_bad_header_values_are_ignored(tmp_path: Path) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    garbage = Scripted(headers=(("x-ratelimit-remaining-tokens", "-3"),
                                ("x-ratelimit-reset-tokens", "20s"),
                                ("anthropic-ratelimit-tokens-remaining", "9" * 40),
                                ("anthropic-ratelimit-tokens-reset", "soon")))  # fmt: skip
    with StandIn(default=garbage, tokens_per_minute=None) as standin, \
            gateway(home, standin, **POLICY) as gw:
        assert _post(gw).status_code == 200
        assert _post(gw).status_code == 200
    assert rows(f"sqlite:///{home / 'ledger.db'}", "SELECT count(*) FROM learned_limits") == [(0,)]
    assert [json.dumps(r.model) for r in standin.requests] == ['"a1"', '"a1"']
