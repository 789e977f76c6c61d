"""Figures `floor` and `ledger cycle`: reserve+settle through the API vs the raw floor, in each
journal mode the ledger runs.

The mode this process's SQLite gets (WAL on a safe library) is measured here; where the
standard library's SQLite is affected by the WAL-reset bug (the ledger then falls back to the
rollback journal) the same figure is measured again in a child process that links it
(`LEDGER_SQLITE=stdlib`), so both modes' ratios come from one run. Goals: in WAL the cycle within
4.0x of the raw WAL + synchronous=FULL floor; in the rollback journal within 2.0x of its floor.

Invariant: floor and ledger runs alternate in the same process on the same disk, and the ratio
is formed per pair, so machine noise hits both sides alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import (
    Row,
    Settings,
    Stats,
    cycles_of,
    ledger_cycle,
    make_home,
    open_ledger,
    per_cycle,
    ratio_row,
    side_by_side,
    time_row,
)
from bench.floor import connect, floor_per_cycle, prepare
from ledger.store import sqlite_driver
from ledger.store.engine import chosen_journal_mode, wal_is_safe

TARGETS = {"wal": 4.0}  # the rollback journal's goal: ROLLBACK_TARGET
ROLLBACK_TARGET = 2.0


def run(root: Path, settings: Settings) -> list[Row]:
    """This process's mode, then the rollback journal's in a child where that is a fallback."""
    here = f"{sqlite_driver.LIBRARY} {sqlite_driver.library_version()}"
    rows = _rows(*_measure(root, settings), chosen_journal_mode(), here)
    if chosen_journal_mode() == "wal" and not wal_is_safe(_stdlib_version()):
        rows += _rollback_rows(root, settings)
    return rows


def _stdlib_version() -> str:
    import sqlite3

    return sqlite3.sqlite_version


def _rollback_rows(root: Path, settings: Settings) -> list[Row]:
    """The same figure in a child process linking the standard library (the fallback)."""
    env = {**os.environ, "LEDGER_SQLITE": "stdlib"}
    scratch = tempfile.mkdtemp(dir=root)
    args = [sys.executable, "-m", "bench.cycle", scratch, "quick" if settings.quick else "full"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    return _rows(found["floors"], found["cycles"], found["mode"], found["library"])


def _rows(floors: list[float], cycles: list[float], mode: str, library: str) -> list[Row]:
    target = TARGETS.get(mode, ROLLBACK_TARGET)
    ratios = [c / f for c, f in zip(cycles, floors, strict=True)]
    ratio = Stats.of(ratios)
    tag = f" ({mode}, {library})"
    return [
        time_row(f"floor: raw reserve+settle per cycle{tag}", Stats.of(floors)),
        time_row(f"ledger cycle: reserve+settle(success) per cycle{tag}", Stats.of(cycles)),
        ratio_row(f"ledger cycle / floor{tag}", ratio, f"<= {target:.1f}", ratio.median <= target),
    ]


def _measure(root: Path, settings: Settings) -> tuple[list[float], list[float]]:
    """Alternate floor and ledger runs; the floor's and the ledger's seconds per cycle."""
    ledger = open_ledger(make_home(root, "cycle"))
    floor_home = make_home(root, "floor")
    open_ledger(floor_home).close()  # migrated schema, same indexes as the ledger
    conn = connect(floor_home / "ledger.db", ledger.policy.busy_timeout_ms)
    prepare(conn)
    try:
        warm = max(3, settings.cycles // 10)
        floor_per_cycle(conn, 0, warm)
        per_cycle(lambda i: ledger_cycle(ledger, i), 0, warm)
        floors, cycles = side_by_side(
            lambda start, count: floor_per_cycle(conn, start, count), cycles_of(ledger),
            settings, warm,
        )
    finally:
        conn.close()
        ledger.close()
    return floors, cycles


if __name__ == "__main__":  # the child of `_rollback_rows`: JSON on stdout
    measured = _measure(Path(sys.argv[1]), Settings.make(sys.argv[2] == "quick"))
    print(json.dumps({
        "floors": measured[0], "cycles": measured[1], "mode": chosen_journal_mode(),
        "library": f"{sqlite_driver.LIBRARY} {sqlite_driver.library_version()}",
    }))  # fmt: skip
