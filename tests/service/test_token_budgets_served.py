"""R-TOK-2 through a real `ledger serve`: `/v1/reserve` and `LedgerClient.reserve` carry the
reservation's token estimate; a `token_budget` refusal keeps its window, limit and target and its
retry time over `/v1`, and at the gateway its text names them with a Retry-After header.

With `replyTokens` 100 and 300 input bytes a reservation's estimate is 100 input + 100 reply
tokens (R-TOK-2: ⌈bytes / 3⌉ + the allowance)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ledger.client import LedgerClient
from ledger.clock import parse_iso_ms
from ledger.errors import Refused, UsageError
from ledger.kinds import RefusalReason
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway
from tests.support.ledgers import TEST_CATALOG
from tests.support.serving import running

EACH = 200


def _home(home: Path, **policy: object) -> None:
    (home / "recovery.json").write_text(json.dumps(
        {"callsPerHour": 1000, "sourceCalls": 1000, "replyTokens": 100, **policy}
    ))


def test_r_tok_2_v1_reserve_and_the_client_carry_the_estimate_and_a_refusal_keeps_its_detail(
    tmp_path: Path,
) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    _home(home, tokenBudgets={"alpha": {"tokensPerMinute": 2 * EACH}})
    with running(home) as served, served.client() as http, LedgerClient(served.socket) as client:
        answer = http.post("/v1/reserve", json={
            "source": "s0", "model": "alpha/small", "input_bytes": 300,
        })  # fmt: skip
        assert answer.status_code == 200, answer.text
        doc = answer.json()
        assert (doc["estimate_tokens"], doc["estimate_input_tokens"],
                doc["estimate_output_tokens"]) == (EACH, 100, 100)  # fmt: skip
        granted = client.reserve("s1", "alpha/small", input_bytes=300)
        assert (granted.estimate_tokens, granted.estimate_input_tokens,
                granted.estimate_output_tokens) == (EACH, 100, 100)  # fmt: skip
        refused = http.post("/v1/reserve", json={
            "source": "s2", "model": "alpha/small", "input_bytes": 300,
        })  # fmt: skip
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == RefusalReason.TOKEN_BUDGET
        assert "tokensPerMinute 400 of provider alpha" in error["message"]
        assert error["retry_at"] is not None  # the first grant leaves the window then
        with pytest.raises(Refused) as info:
            client.reserve("s3", "alpha/small", input_bytes=300)
        assert info.value.reason == RefusalReason.TOKEN_BUDGET
        assert info.value.detail == "tokensPerMinute 400 of provider alpha"
        assert info.value.retry_at_ms is not None
        created = parse_iso_ms(doc["created"])
        assert created is not None
        assert info.value.retry_at_ms == created + 60_000


def test_r_tok_2_gateway_token_refusal_is_429_naming_window_limit_target_with_retry_after(
    tmp_path: Path,
) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    # no backup (with one, the selection would send the request to a backup with room, R-TOK-4)
    policy = {"callsPerHour": 1000, "replyTokens": 100, "crossProviderFallback": False,
              "tokenBudgets": {"acme": {"tokensPerMinute": 250}}}
    chat = {"model": "acme/a1", "messages": [{"role": "user", "content": "hello"}]}
    used = Scripted(input_tokens=100, output_tokens=100)  # the first settles at 200 tokens
    with StandIn(default=used) as standin, gateway(home, standin, **policy) as gw:
        auth = {"authorization": f"Bearer {gw.token}"}
        first = httpx.post(gw.url + "/openai/v1/chat/completions", json=chat, headers=auth,
                           timeout=60)
        assert first.status_code == 200, first.text
        second = httpx.post(gw.url + "/openai/v1/chat/completions", json=chat, headers=auth,
                            timeout=60)
    assert second.status_code == 429, second.text
    body = second.json()["error"]
    assert body["code"] == RefusalReason.TOKEN_BUDGET
    assert "for tokensPerMinute 250 of provider acme" in body["message"]
    wait = int(second.headers["retry-after"])
    assert 1 <= wait <= 60
    assert len(standin.requests) == 1  # the refused request never reached the upstream


def test_r_tok_1_the_client_reads_scope_windows_and_claims_around_a_full_scope(
    tmp_path: Path,
) -> None:
    """What the worker's claiming round needs over the service: each token window's use (from
    the status document) and a claim that skips the sources of a scope whose window is full."""
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    _home(home, scopes={"batch": {"tokensPerMinute": 2 * EACH}})
    with running(home) as served, LedgerClient(served.socket) as client:
        client.reserve("s0", "alpha/small", input_bytes=300, scopes=["batch"])
        (window,) = client.token_windows()
        assert (window.kind, window.name, window.window, window.limit, window.used) == (
            "scope", "batch", "tokensPerMinute", 2 * EACH, EACH
        )
        assert window.frees_at_ms is not None
        client.add_source("in-batch", "x", scopes=["batch"])
        client.add_source("outside", "x")
        now = client.ledger_now() + 1
        claimed = client.claim("w", checked_before=now, skip_scopes=["batch"])
        assert claimed is not None
        assert claimed.source_id == "outside"
        assert client.claim("w", checked_before=now, skip_scopes=["batch"]) is None
        with pytest.raises(UsageError):
            client.claim("w", checked_before=now, skip_scopes=["nope"])
