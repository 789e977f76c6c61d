"""R-TOK-2 across processes: sixteen spawned processes reserve at once under a provider's
`tokensPerMinute` with the ledger's clock frozen. The estimates granted never add up past the
limit, and nothing refused would have fit in what was left at the end (no under-grant: with the
clock frozen the window only fills, so a request refused earlier would be refused now too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.api import Ledger
from ledger.errors import LedgerError, Refused
from ledger.kinds import RefusalReason
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import T0, TEST_CATALOG
from tests.support.procs import BarrierLike, Frozen, QueueLike, race, write_home

PROCESSES = 16
ATTEMPTS = 3
LIMIT = 9_000  # tokens per minute on provider alpha
REPLY = 500  # replyTokens: every estimate is its input bound + 500


def racer(home: str, db: str | None, tag: int, barrier: BarrierLike, out: QueueLike) -> None:
    granted: list[int] = []
    refused: list[tuple[str, int]] = []
    errors: list[str] = []
    try:
        led = Ledger.open(home, db, env={}, clock=Frozen(T0))
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
def test_r_tok_2_sixteen_processes_never_overshoot_nor_under_grant_a_token_window(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, callsPerHour=10_000, sourceCalls=5, replyTokens=REPLY,
               tokenBudgets={"alpha": {"tokensPerMinute": LIMIT}})
    Ledger.open(home, ledger_db, env={}, clock=Frozen(T0)).close()  # the schema, once
    reports = race(racer, PROCESSES, lambda tag, barrier, out: (
        str(home), ledger_db, tag, barrier, out))
    assert [e for r in reports for e in r["errors"]] == []
    granted = [rid for r in reports for rid in r["granted"]]
    refused = [tuple(x) for r in reports for x in r["refused"]]
    stored = rows(db_url(home, ledger_db),
                  "SELECT id, estimate_input_tokens + estimate_output_tokens FROM reservations")
    assert sorted(rid for rid, _ in stored) == sorted(granted)
    total = sum(int(tokens) for _, tokens in stored)
    assert total <= LIMIT  # never an overshoot
    assert refused, "the race must reach the limit"
    assert {reason for reason, _ in refused} == {RefusalReason.TOKEN_BUDGET}
    assert all(total + estimate > LIMIT for _, estimate in refused)  # never an under-grant
