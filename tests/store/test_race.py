"""R-RES-1..7, R-DB-2, R-DB-3, SPEC 15: real processes racing for the same budgets never overshoot.

The race harness runs once against the real ledger and once against a deliberately broken variant
(check in one transaction, insert in another) to prove it can see an overshoot. The contention
test mixes reserve and settle over many sources and models under several budgets at once and
checks every limit afterwards from the database.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ledger.api import Ledger
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import TEST_CATALOG
from tests.support.procs import contention_worker, race, race_worker, write_home

PROCESSES = 6
ATTEMPTS = 12  # per process: 72 attempts against K = 20
K = 20


# The contract suite (R-DB-7): every race runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)


def run_race(
    home: Path, db: str | None, *, broken: bool
) -> tuple[list[int], Counter[str], list[str]]:
    """Release PROCESSES spawned racers together; return granted ids, refusals and errors."""
    write_home(home, TEST_CATALOG, callsPerHour=K, sourceCalls=1)
    Ledger.open(home, db, env={}).close()  # the migrations build the schema before the race
    reports = race(race_worker, PROCESSES, lambda tag, barrier, out: (
        str(home), barrier, tag, ATTEMPTS, broken, out, db))
    granted = [rid for report in reports for rid in report["granted"]]
    refused: Counter[str] = Counter()
    for report in reports:
        refused.update(report["refused"])
    errors = [err for report in reports for err in report["errors"]]
    return granted, refused, errors


def db_ids(home: Path, db: str | None) -> list[int]:
    return [row[0] for row in rows(db_url(home, db), "SELECT id FROM reservations")]


def test_r_res_1_race_exactly_k_granted_across_processes(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    granted, refused, errors = run_race(home, ledger_db, broken=False)
    assert errors == []
    assert len(granted) == K
    assert refused == {"shared_hourly_budget": PROCESSES * ATTEMPTS - K}
    stored = db_ids(home, ledger_db)
    assert len(stored) == K  # nothing lost, nothing double-counted
    assert Counter(granted) == Counter(stored)


@pytest.mark.slow
def test_r_db_2_race_harness_detects_a_broken_transaction_scope(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    granted, _refused, errors = run_race(home, ledger_db, broken=True)
    assert errors == []
    assert len(granted) > K  # the check-then-insert variant overshoots; the harness sees it
    assert len(db_ids(home, ledger_db)) == len(granted)


CONTENDERS = 8
OPERATIONS = 40
LIMITS = {"callsPerHour": 60, "sourceCalls": 3, "sourceModels": 2, "dailyEstimatedUsd": 1.2}
SOURCES = [f"src-{i}" for i in range(24)]
MODELS = ["alpha/small", "alpha/big", "beta/mid", "gamma/g1"]


def test_r_db_2_contention_mixed_reserve_settle_never_overshoots(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, **LIMITS)
    Ledger.open(home, ledger_db, env={}).close()
    reports = race(contention_worker, CONTENDERS, lambda seed, barrier, out: (
        str(home), barrier, seed, OPERATIONS, SOURCES, MODELS, out, ledger_db))
    # no caller saw an unhandled `database is locked` (nor a clean BusyError with a 10 s timeout)
    assert [err for report in reports for err in report["errors"]] == []
    granted = [tuple(g) for report in reports for g in report["granted"]]
    refused: Counter[str] = Counter()
    for report in reports:
        refused.update(report["refused"])

    stored = rows(
        db_url(home, ledger_db),
        "SELECT id, source_id, model_key, created_ms, cost_micro FROM reservations ORDER BY id",
    )
    # every returned reservation is present exactly once, with its source and model
    assert Counter(granted) == Counter((r[0], r[1], r[2]) for r in stored)
    hour = 3_600_000
    ceiling = round(LIMITS["dailyEstimatedUsd"] * 1_000_000)
    spent = 0
    for i, (_rid, _src, _model, created, cost) in enumerate(stored):
        in_window = [r for r in stored[: i + 1] if r[3] > created - hour]
        assert len(in_window) <= LIMITS["callsPerHour"]
        spent += cost  # final costs never exceed the estimates the check counted
        assert spent <= ceiling
    for source in SOURCES:
        mine = [r for r in stored if r[1] == source]
        assert len(mine) <= LIMITS["sourceCalls"]
        assert len({r[2] for r in mine}) <= LIMITS["sourceModels"]
    settled = sum(report["settled"] for report in reports)
    print(f"contention: {CONTENDERS} processes, {len(stored)} granted, {settled} settled, "
          f"refusals {dict(refused)}")
