"""R-TOK-4 across processes: a provider said 9,000 tokens are left on alpha/small; sixteen spawned
processes then reserve at once with the ledger's clock frozen after that reading. Each subtracts
every other's grants, so the estimates granted never add up past what was left, and nothing
refused would have fit in what was left at the end (the clock is frozen: the remainder only
shrinks, so a request refused earlier would be refused now too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.api import Ledger
from ledger.errors import LedgerError, Refused
from ledger.kinds import RefusalReason
from ledger.learned import read_limits
from ledger.records import Success
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import T0, TEST_CATALOG
from tests.support.procs import BarrierLike, Frozen, QueueLike, race, write_home

PROCESSES = 16
ATTEMPTS = 3
LEFT = 9_000  # what the provider said is left
REPLY = 500  # replyTokens: every estimate is its input bound + 500


def racer(home: str, db: str | None, tag: int, barrier: BarrierLike, out: QueueLike) -> None:
    granted: list[int] = []
    refused: list[tuple[str, int]] = []
    errors: list[str] = []
    try:
        led = Ledger.open(home, db, env={}, clock=Frozen(T0 + 1))
        barrier.wait(timeout=120)
        for i in range(ATTEMPTS):
            size = 300 * (1 + (tag + i) % 4)  # 100..400 input tokens: estimates of 600..900
            try:
                granted.append(led.reserve(f"t-{tag}-{i}", "alpha/small", input_bytes=size).id)
            except Refused as refusal:
                refused.append((refusal.reason, size // 3 + REPLY))
            except LedgerError as error:
                errors.append(type(error).__name__)
        led.close()
    except Exception as error:  # reported, never swallowed: the parent asserts there are none
        errors.append(f"{type(error).__name__}: {error}")
    out.put({"granted": granted, "refused": refused, "errors": errors})


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_4_sixteen_processes_cannot_each_spend_the_same_remainder(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, callsPerHour=10_000, sourceCalls=5, replyTokens=REPLY)
    led = Ledger.open(home, ledger_db, env={}, clock=Frozen(T0))
    heard = led.reserve("heard", "alpha/small")
    headers = {"x-ratelimit-remaining-tokens": str(LEFT), "x-ratelimit-reset-tokens": "20s"}
    led.settle(heard.id, Success(10, 5, limits=read_limits(headers, T0)))
    led.close()
    reports = race(racer, PROCESSES, lambda tag, barrier, out: (
        str(home), ledger_db, tag, barrier, out))
    assert [e for r in reports for e in r["errors"]] == []
    granted = [rid for r in reports for rid in r["granted"]]
    refused = [tuple(x) for r in reports for x in r["refused"]]
    stored = rows(db_url(home, ledger_db),
                  "SELECT id, estimate_input_tokens + estimate_output_tokens FROM reservations"
                  f" WHERE id <> {heard.id}")
    assert sorted(rid for rid, _ in stored) == sorted(granted)
    total = sum(int(tokens) for _, tokens in stored)
    assert total <= LEFT  # never more than the provider said is left
    assert refused, "the race must reach the remainder"
    assert {reason for reason, _ in refused} == {RefusalReason.PROVIDER_TOKENS_EXHAUSTED}
    assert all(total + estimate > LEFT for _, estimate in refused)  # never an under-grant
