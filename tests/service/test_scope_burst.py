"""R-SC-1 under a burst of real processes: a scope's budgets are exact across the library, the
CLI and `LedgerClient` through real `ledger serve` processes, on SQLite and on PostgreSQL."""

from __future__ import annotations

import multiprocessing
import random
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.errors import Refused
from ledger.records import Success
from tests.support.backends import fresh_pg_database, pg_server_url, rows
from tests.support.ledgers import TEST_CATALOG
from tests.support.procs import write_home
from tests.support.scope_procs import MODEL, burst_child, in_flight_child
from tests.support.serving import Served, running

CEILING = 5_000_000  # $5 in micro-USD
EST = 8192  # alpha/small with no input: its 4096-token reply allowance at $2/MTok
POLICY: dict[str, Any] = {
    "callsPerHour": 100_000,
    "scopes": {"burst": {"dailyEstimatedUsd": 5}, "wide": {"callsPerHour": 100_000}},
}
# 16 processes, 1,000 reservations: 6 library, 6 LedgerClient (through the services), 4 CLI
PLAN = [("library", 80)] * 6 + [("client", 80)] * 6 + [("cli", 10)] * 4


@contextmanager
def _services(homes: list[Path], db: str | None) -> Iterator[list[Served]]:
    with ExitStack() as stack:
        yield [stack.enter_context(running(home, db=db)) for home in homes]


def _burst(homes: list[Path], db: str | None) -> tuple[list[int], Counter[str]]:
    """Run PLAN at once; every child's grants and refusals (the children report no error)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(PLAN))
    queue = ctx.Queue()
    with _services(homes, db) as services:
        procs = []
        for tag, (how, attempts) in enumerate(PLAN):
            home = homes[tag % len(homes)]
            target = str(services[tag % len(services)].socket) if how == "client" else str(home)
            procs.append(ctx.Process(
                target=burst_child,
                args=(how, target, db, tag, attempts, ["burst", "wide"], barrier, queue),
            ))
        for proc in procs:
            proc.start()
        reports = [queue.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join(60)
    granted: list[int] = []
    refused: Counter[str] = Counter()
    for report in reports:
        assert report["errors"] == [], report
        granted += [rid for rid, _ in report["granted"]]
        refused.update(report["refused"])
    return granted, refused


def _scope_cost(url: str) -> tuple[int, int]:
    """The burst scope's count of reservations and its 24 h cost, read from the database."""
    (count, cost), = rows(
        url,
        "SELECT COUNT(*), COALESCE(SUM(r.cost_micro), 0) FROM reservation_scopes s"
        " JOIN reservations r ON r.id = s.reservation_id WHERE s.scope = 'burst'",
    )
    return int(count), int(cost)


def _check_burst_then_settle(homes: list[Path], url: str, db: str | None) -> None:
    granted, refused = _burst(homes, db)
    attempts = sum(n for _, n in PLAN)
    estimates = rows(url, "SELECT id, estimate_micro FROM reservations")
    assert sorted(r[0] for r in estimates) == sorted(granted)  # none lost, none counted twice
    total = sum(int(r[1]) for r in estimates)
    assert total <= CEILING  # the sum of granted estimates never exceeds $5
    assert len(granted) == CEILING // EST  # exact: never fewer either
    assert refused == {"scope_daily_cost": attempts - len(granted)}
    assert _scope_cost(url) == (len(granted), total)
    # settle every grant with real usage (at most the reply allowance), then fill the freed room
    led = Ledger.open(homes[0], db, env={})
    try:
        rng = random.Random(7)
        for rid in granted:
            led.settle(rid, Success(input_tokens=0, output_tokens=rng.randint(1, 4096)))
        settled = _scope_cost(url)[1]
        assert settled < total
        more = (CEILING - settled) // EST  # what the settled usage freed
        for i in range(more):
            led.reserve(f"after-{i}", MODEL, scopes=["burst"])
        with pytest.raises(Refused) as info:
            led.reserve("one-too-many", MODEL, scopes=["burst"])
        assert info.value.reason == "scope_daily_cost"
        cost = _scope_cost(url)[1]
        assert cost <= CEILING  # the scope's 24 h cost after settling stays within $5
        assert cost + EST > CEILING  # and the freed room was handed out, not lost
    finally:
        led.close()


@pytest.mark.slow
@pytest.mark.timeout(900)  # 1,000 reservations from 16 processes on a shared 2-core machine
def test_r_sc_1_burst_of_16_processes_never_overspends_a_scope_sqlite(tmp_path: Path) -> None:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, **POLICY)
    Ledger.open(home, env={}).close()  # created before the race
    _check_burst_then_settle([home], f"sqlite:///{home / 'ledger.db'}", None)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_r_sc_1_burst_across_two_services_on_one_postgresql_never_overspends(
    tmp_path: Path,
) -> None:
    pg_server_url()
    with fresh_pg_database() as url:
        homes = [tmp_path / "a", tmp_path / "b"]
        for home in homes:
            write_home(home, TEST_CATALOG, **POLICY)
        Ledger.open(homes[0], url, env={}).close()  # migrated once before the race
        _check_burst_then_settle(homes, url, url)


IN_FLIGHT = 3
SLOT_POLICY: dict[str, Any] = {
    "callsPerHour": 100_000,
    "timeoutMs": 1000,  # a reservation left open expires within a second
    "sourceTimeMs": 1000,
    "scopes": {"slots": {"inFlight": IN_FLIGHT}},
}


def _most_open_at_once(url: str) -> tuple[int, int]:
    """From the stored times: the most reservations of the scope open at one ledger moment
    (each open from its creation until its settle or its deadline, whichever came first), and
    how many there were."""
    found = rows(
        url,
        "SELECT r.created_ms, CASE WHEN r.settled_ms < r.deadline_ms THEN r.settled_ms"
        " ELSE r.deadline_ms END FROM reservations r"
        " JOIN reservation_scopes s ON s.reservation_id = r.id WHERE s.scope = 'slots'",
    )
    # an end sorts before a start at the same moment: a slot freed then is free for it
    events = sorted([(int(end), -1) for _, end in found] + [(int(start), 1) for start, _ in found])
    most = level = 0
    for _, step in events:
        level += step
        most = max(most, level)
    return most, len(found)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_r_sc_1_in_flight_is_exact_across_processes_and_services(
    tmp_path: Path, backend: str
) -> None:
    with ExitStack() as stack:
        db = None if backend == "sqlite" else stack.enter_context(fresh_pg_database())
        home = tmp_path / "state"
        write_home(home, TEST_CATALOG, **SLOT_POLICY)
        Ledger.open(home, db, env={}).close()
        url = db or f"sqlite:///{home / 'ledger.db'}"
        plan = [("library", 12)] * 4 + [("client", 12)] * 4
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(len(plan))
        queue = ctx.Queue()
        with running(home, db=db) as served:
            procs = [
                ctx.Process(
                    target=in_flight_child,
                    args=(how, str(served.socket) if how == "client" else str(home), db, tag,
                          grants, barrier, queue),
                )
                for tag, (how, grants) in enumerate(plan)
            ]
            for proc in procs:
                proc.start()
            reports = [queue.get(timeout=600) for _ in procs]
            for proc in procs:
                proc.join(60)
        refused: Counter[str] = Counter()
        for report in reports:
            assert report["errors"] == [], report
            refused.update(report["refused"])
        granted = sorted(rid for report in reports for rid in report["granted"])
        assert len(granted) == sum(n for _, n in plan)  # settled and expired slots came free
        assert set(refused) <= {"scope_in_flight"}
        most, count = _most_open_at_once(url)
        assert count == len(granted)
        assert most == IN_FLIGHT  # never more than inFlight open at once (and it was reached)
