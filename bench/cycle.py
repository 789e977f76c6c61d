"""Figures `floor` and `ledger cycle`: reserve+settle through the API vs the stdlib floor.

Invariant: floor and ledger runs alternate in the same process on the same disk, and the ratio
is formed per pair, so machine noise hits both sides alike.
"""

from __future__ import annotations

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

TARGET_RATIO = 2.0


def run(root: Path, settings: Settings) -> list[Row]:
    """Alternate floor and ledger runs; report both times and the ratio per pair."""
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
        ratios = [c / f for c, f in zip(cycles, floors, strict=True)]
    finally:
        conn.close()
        ledger.close()
    ratio = Stats.of(ratios)
    return [
        time_row("floor: stdlib sqlite3 reserve+settle per cycle", Stats.of(floors)),
        time_row("ledger cycle: reserve+settle(success) per cycle", Stats.of(cycles)),
        ratio_row(
            "ledger cycle / floor", ratio, f"<= {TARGET_RATIO:.1f}", ratio.median <= TARGET_RATIO
        ),
    ]
