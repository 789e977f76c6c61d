"""R-SIM-1 (issue 29 item 19): `ledger simulate` runs on a throw-away ledger of its own; with
`$LEDGER_DB` naming a real ledger (SQLite or PostgreSQL) it never writes that database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import LedgerFactory, write_policy

pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)

TABLES = ("sources", "reservations", "cost_hours", "cooldowns", "probes", "health", "notices")


def _contents(url: str) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(rows(url, f"SELECT * FROM {t}"), key=repr) for t in TABLES}


def test_r_sim_1_simulate_with_ledger_db_set_never_writes_that_database(
    home: Path, ledger_db: str | None, make_ledger: LedgerFactory, tmp_path: Path
) -> None:
    write_policy(home, defaultModel="alpha/small", callsPerHour=50)
    led = make_ledger(defaultModel="alpha/small", callsPerHour=50)
    led.add_source("real", "ref")
    led.reserve("real", "alpha/small")
    led.close()
    url = db_url(home, ledger_db)
    before = _contents(url)
    assert before["reservations"]  # the real ledger has something to lose
    db_file = home / "ledger.db"
    stamp = db_file.stat().st_mtime_ns if ledger_db is None else None
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({
        "format": "ledger-scenario", "version": 1, "start": "2027-01-15T00:00Z", "hours": 1,
        "latency": {"fixedMs": 1000}, "tokens": {"input": 100, "output": 10},
        "inputBytes": 300, "arrivals": [{"at": "00:00", "count": 20}],
        "windows": [{"target": "alpha/small", "from": "00:00", "for": "10m", "status": 429}],
    }))  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "simulate", "--trace",
         str(scenario), "--json"],
        env={**os.environ, "LEDGER_DB": url}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["format"] == "ledger-simulation"
    assert sum(report["current"]["callsByModel"].values()) > 0  # it did reserve and settle
    assert _contents(url) == before
    if stamp is not None:
        assert db_file.stat().st_mtime_ns == stamp
