"""R-TOK-2 and R-TOK-4 at the worker's claiming round: when a token window is full for even the
smallest request (no route has room for its reply allowance), every other due source would find
the same, so the pass ends after the first such item, as it does on the hourly call budget,
instead of claiming and releasing each queued source. A window that only a large payload does
not fit leaves the round going for the sources that fit. A scope's token window (R-TOK-1) full
for the smallest request ends the round for the sources added under that scope only: the pass
claims none of them after, and goes on with the others.

p1/m1's reply allowance is 1,024 tokens (its maxOutputTokens); one shared window over every model
(`p*/*`) holds the fleet's tokens per minute."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.clock import now_ms
from ledger.learned import read_limits
from ledger.records import Success
from ledger.standin.server import StandIn
from ledger.worker.drain import drain
from ledger.worker.handler import Job
from ledger.worker.queue import HandlerResult
from tests.support.backends import BACKENDS
from tests.support.ledgers import LedgerFactory
from tests.support.queue_setup import db_rows, open_ledger, standin_home

USED = 2_024  # 1,000 input tokens (3,000 bytes) + the 1,024-token reply allowance


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


def _queued(home: Path, payloads: list[str]) -> None:
    led = open_ledger(home)
    led.reserve("earlier", "p1/m1", input_bytes=3000)  # the window holds USED tokens
    for n, payload in enumerate(payloads):
        led.add_source(f"src-{n}", payload)
    led.close()


def _once(home: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["--home", str(home), "worker", "run", "--once", "--json"])
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def test_r_tok_2_a_full_token_window_ends_the_claiming_round(
    tmp_path: Path, standin: StandIn
) -> None:
    limit = USED + 1_000  # room for 1,000 more: not even a reply allowance
    home = standin_home(tmp_path / "home", standin, sourceCalls=100,
                        tokenBudgets={"p*/*": {"tokensPerMinute": limit}})  # fmt: skip
    _queued(home, ["x"] * 5)
    before = db_rows(home, "SELECT id, last_checked_ms FROM sources WHERE id LIKE 'src-%'")
    doc = _once(home)
    assert doc["items"] == 1  # one claimed, found no room: the others were not claimed
    assert doc["unroutable"] == 1
    assert standin.requests == []
    after = db_rows(home, "SELECT id, last_checked_ms FROM sources WHERE id LIKE 'src-%'")
    assert len(set(after) - set(before)) == 1  # only the one claimed was checked


def test_r_tok_4_a_full_learned_limit_ends_the_claiming_round(
    tmp_path: Path, standin: StandIn
) -> None:
    home = standin_home(tmp_path / "home", standin, sourceCalls=100, crossProviderFallback=False)
    led = open_ledger(home)
    heard = led.reserve("heard", "p1/m1")
    headers = {"x-ratelimit-remaining-tokens": "500", "x-ratelimit-reset-tokens": "30s"}
    led.settle(heard.id, Success(10, 5, limits=read_limits(headers, now_ms() - 1)))
    for n in range(4):
        led.add_source(f"src-{n}", "x")
    led.close()
    doc = _once(home)
    assert doc["items"] == 1
    assert standin.requests == []


def test_r_tok_2_a_window_only_a_large_payload_misses_keeps_the_round_going(
    tmp_path: Path, standin: StandIn
) -> None:
    # room for a small payload (513 bytes: 171 + 1,024 = 1,195 tokens), not for a large one
    # (1,512 bytes: 504 + 1,024 = 1,528); each small one settles with 15 tokens of usage
    limit = USED + 1_300
    home = standin_home(tmp_path / "home", standin, sourceCalls=100,
                        tokenBudgets={"p*/*": {"tokensPerMinute": limit}})  # fmt: skip
    _queued(home, ["y" * 1_000, "x", "x"])
    doc = _once(home)
    assert doc["done"] == 2  # both small payloads were claimed after the large one and served
    assert doc["unroutable"] >= 1  # the large one, in each pass
    assert len(standin.requests) == 2


# --- a scope's token window (R-TOK-1: a scope takes the same token keys) ---------------------


def _scoped(home: Path, scoped: list[str], free: list[str]) -> None:
    """`earlier` holds USED tokens of scope batch's window; `batch-N` sources are added under
    the scope, `free-N` ones under none."""
    led = open_ledger(home)
    led.reserve("earlier", "p1/m1", input_bytes=3000, scopes=["batch"])
    for n, payload in enumerate(scoped):
        led.add_source(f"batch-{n}", payload, scopes=["batch"])
    for n, payload in enumerate(free):
        led.add_source(f"free-{n}", payload)
    led.close()


def _checked(home: Path, prefix: str) -> set[tuple[str, int]]:
    rows = db_rows(home, "SELECT id, last_checked_ms FROM sources WHERE id LIKE ?", f"{prefix}%")
    return {(str(i), int(t)) for i, t in rows}


def test_r_tok_1_a_full_scope_window_ends_the_round_for_its_sources_only(
    tmp_path: Path, standin: StandIn
) -> None:
    limit = USED + 1_000  # room for 1,000 more: not even a reply allowance
    home = standin_home(tmp_path / "home", standin, sourceCalls=100,
                        scopes={"batch": {"tokensPerMinute": limit}})  # fmt: skip
    _scoped(home, ["x"] * 5, ["x"] * 2)
    before = _checked(home, "batch-")
    doc = _once(home)
    # the first batch source met the full window; no other batch source was claimed after it,
    # while the sources of no scope were served
    assert doc["done"] == 2
    assert doc["refused"] == doc["items"] - 2
    assert len(standin.requests) == 2
    claimed = _checked(home, "batch-") - before
    assert len(claimed) == doc["refused"] < 5  # one per pass, never each of them


def test_r_tok_1_a_full_scope_window_with_only_its_sources_queued_ends_the_round(
    tmp_path: Path, standin: StandIn
) -> None:
    home = standin_home(tmp_path / "home", standin, sourceCalls=100,
                        scopes={"batch": {"tokensPerMinute": USED + 1_000}})  # fmt: skip
    _scoped(home, ["x"] * 5, [])
    doc = _once(home)
    assert (doc["items"], doc["refused"]) == (1, 1)
    assert standin.requests == []


def test_r_tok_1_a_scope_window_only_a_large_payload_misses_keeps_the_round_going(
    tmp_path: Path, standin: StandIn
) -> None:
    # room for a small payload (171 + 1,024 = 1,195 tokens), not for a large one (1,528)
    home = standin_home(tmp_path / "home", standin, sourceCalls=100,
                        scopes={"batch": {"tokensPerMinute": USED + 1_300}})  # fmt: skip
    _scoped(home, ["y" * 1_000, "x", "x"], [])
    doc = _once(home)
    assert doc["done"] == 2  # both small payloads of the scope were served after the large one
    assert len(standin.requests) == 2


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_1_the_claim_skips_a_full_scopes_sources_on_both_backends(
    make_ledger: LedgerFactory,
) -> None:
    """The library's drain: the scope's window holds one estimate (100 + 100 tokens) of 250;
    after a source of it is refused, the pass claims none of its other sources, while the
    source of no scope is served: one refusal in the pass that served it, one in the next
    (unproductive) pass, never one per queued source."""
    led = make_ledger(defaultModel="alpha/small", replyTokens=100, sourceCalls=100,
                      scopes={"batch": {"tokensPerMinute": 250}})  # fmt: skip
    led.reserve("earlier", "alpha/small", input_bytes=300, scopes=["batch"])
    for n in range(4):
        led.add_source(f"batch-{n}", "x", scopes=["batch"])
    led.add_source("zz-free", "x")
    served: list[str] = []

    def handler(job: Job) -> HandlerResult:
        served.append(job.source_id)
        return HandlerResult.success()

    summary = drain(led, handler, worker_id="w", max_items=10)
    assert served == ["zz-free"]
    assert (summary.items, summary.done, summary.refused) == (3, 1, 2)
