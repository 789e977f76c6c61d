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
    ledger_cycle,
    make_home,
    open_ledger,
    per_cycle,
    ratio_row,
    time_row,
)
from bench.floor import connect, floor_per_cycle, prepare

TARGET_RATIO = 2.0
CHUNK = 10


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
        floors: list[float] = []
        cycles: list[float] = []
        ratios: list[float] = []
        offset = warm
        for _ in range(settings.runs):
            # alternate in small chunks so a change in disk load hits both sides alike
            f_total = c_total = 0.0
            done = 0
            while done < settings.cycles:
                n = min(CHUNK, settings.cycles - done)
                f_total += n * floor_per_cycle(conn, offset, n)
                c_total += n * per_cycle(lambda i: ledger_cycle(ledger, i), offset, n)
                offset += n
                done += n
            floors.append(f_total / done)
            cycles.append(c_total / done)
            ratios.append(c_total / f_total)
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
