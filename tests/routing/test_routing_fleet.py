"""Routing as fleet state (R-RT-5, R-RT-6 with R-DB-2): real processes share one pool cursor and
one sticky lease through the ledger, on SQLite and PostgreSQL; budgets stay exact through pools."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.kinds import CooldownScope
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.procs import write_home
from tests.support.queue_setup import cli_env
from tests.support.routing_fixtures import MEMBERS, routing_catalog
from tests.support.routing_procs import pool_racer

pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)

PROCESSES = 8
ATTEMPTS = 50
POOL = {"p": {"candidates": MEMBERS, "strategy": "round-robin"}}
ROOMY = {"callsPerHour": 100_000, "sourceCalls": 100, "sourceModels": 10}


def race(home: Path, db: str | None, model: str, during: Any = None) -> list[dict[str, Any]]:
    """PROCESSES spawned children reserve ATTEMPTS times each through `model`, released together;
    `during(home, db)` runs in a thread while they do."""
    Ledger.open(home, db, env={}).close()  # the schema exists before the race
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=pool_racer,
            args=(str(home), barrier, tag, ATTEMPTS, model, out),
            kwargs={"db": db},
        )
        for tag in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    side = None
    if during is not None:
        side = threading.Thread(target=during, args=(home, db))
        side.start()
    reports = [out.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    if side is not None:
        side.join(timeout=120)
    assert [e for r in reports for e in r["errors"]] == []
    return reports


def stored(home: Path, db: str | None) -> list[tuple[Any, ...]]:
    return rows(db_url(home, db), "SELECT id, model_key, pool FROM reservations ORDER BY id")


def test_r_rt_5_round_robin_is_exact_across_processes(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    write_home(home, routing_catalog(), pools=POOL, **ROOMY)
    reports = race(home, ledger_db, "pool/p")
    granted = Counter(model for r in reports for _rid, model in r["granted"])
    assert sum(granted.values()) == PROCESSES * ATTEMPTS
    assert all(abs(granted[m] - 100) <= 1 for m in MEMBERS), granted
    rows_ = stored(home, ledger_db)
    assert Counter(r[1] for r in rows_) == granted  # the database agrees with every caller
    assert {r[2] for r in rows_} == {"p"}


def _cool_acct2_mid_run(home: Path, db: str | None) -> None:
    url = db_url(home, db)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if rows(url, "SELECT COUNT(*) FROM reservations")[0][0] >= 100:
            break
        time.sleep(0.01)
    led = Ledger.open(home, db, env={})
    try:
        led.store.set_cooldown(CooldownScope.MODEL, "acct2/m", 3_600_000, None)
    finally:
        led.close()


def test_r_rt_5_a_candidate_cooling_mid_run_is_skipped_and_the_rest_stay_even(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    write_home(home, routing_catalog(), pools=POOL, **ROOMY)
    race(home, ledger_db, "pool/p", during=_cool_acct2_mid_run)
    rows_ = stored(home, ledger_db)
    assert len(rows_) == PROCESSES * ATTEMPTS
    last_acct2 = max(r[0] for r in rows_ if r[1] == "acct2/m")
    after = Counter(r[1] for r in rows_ if r[0] > last_acct2)
    assert "acct2/m" not in after
    assert max(after.values()) - min(after.values()) <= 1, after  # a rotation over the rest
    before = Counter(r[1] for r in rows_ if r[0] <= last_acct2)
    assert max(before.values()) - min(before.values()) <= 1, before
    assert after.total() > 0  # it cooled mid-run, not after


def test_r_rt_1_budgets_stay_exact_with_every_reservation_through_pools(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    # 20 an hour, a ceiling for about 15 estimates: both budgets race through the pool
    write_home(home, routing_catalog(), pools=POOL, callsPerHour=20, sourceCalls=1,
               dailyEstimatedUsd=0.25)  # fmt: skip
    reports = race(home, ledger_db, "pool/p")
    granted = [g for r in reports for g in r["granted"]]
    refused: Counter[str] = Counter()
    for r in reports:
        refused.update(r["refused"])
    rows_ = rows(db_url(home, ledger_db), "SELECT cost_micro FROM reservations")
    assert len(rows_) == len(granted) <= 20
    assert sum(int(c) for (c,) in rows_) <= 250_000
    assert sum(refused.values()) == PROCESSES * ATTEMPTS - len(granted)
    assert set(refused) <= {"shared_hourly_budget", "daily_cost_ceiling"}
    estimate = int(rows_[0][0])
    assert len(granted) == min(20, 250_000 // estimate)  # exactly as many as both budgets allow


def _cli(home: Path, db: str | None, *args: str) -> dict[str, Any]:
    where = ["--db", db] if db else []
    done = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), *where, *args, "--json"],
        capture_output=True, text=True, env=cli_env(), timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_r_rt_6_stickiness_is_shared_across_processes_and_restarts(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    sticky = {"p": {"candidates": MEMBERS, "strategy": "round-robin", "sticky": "on"}}
    write_home(home, routing_catalog(), pools=sticky, **ROOMY)
    first = _cli(home, ledger_db, "reserve", "s1", "--model", "pool/p", "--input-bytes", "10")
    usage = ["--input-tokens", "1", "--output-tokens", "1"]
    _cli(home, ledger_db, "settle", str(first["id"]), "--ok", *usage)
    other = _cli(home, ledger_db, "reserve", "s2", "--model", "pool/p", "--input-bytes", "10")
    assert other["model"] != first["model"]  # s2 has no lease: the rotation moves on
    # each CLI run is a new process: the lease is a row every process (and restart) reads
    again = [_cli(home, ledger_db, "reserve", "s1", "--model", "pool/p", "--input-bytes", "10")
             for _ in range(2)]  # fmt: skip
    assert {a["model"] for a in again} == {first["model"]}
    assert {a["pool"] for a in again} == {"p"}
