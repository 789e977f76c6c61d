"""Figure `scopes` (issue 32, R-SC-1): a reserve under 3 scopes vs a plain reserve.

Invariant: both kinds of reserve alternate in chunks on the same ledger in the same process, so
machine noise and the ledger's size hit both alike; each reservation is settled outside the timed
part (an open one would count toward inFlight). The 3 scopes set one limit each (callsPerHour,
dailyEstimatedUsd, inFlight), so every kind of scope read is in the scoped reserve. The burst
rows beside snipz (overshoot of a $5 scope, reservations per second) come from bench/scope_burst.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench import scope_burst
from bench.common import (
    BIG,
    Chunk,
    Row,
    Settings,
    Stats,
    bench_policy,
    make_home,
    open_ledger,
    ratio_row,
    side_by_side,
    time_row,
)
from ledger.api import Ledger
from ledger.records import Success

TARGET_RATIO = 1.2
SCOPES = {
    "hour": {"callsPerHour": BIG},
    "day": {"dailyEstimatedUsd": 10**9},
    "slots": {"inFlight": BIG},
}
NAMES = tuple(SCOPES)


def _reserve_chunk(ledger: Ledger, scopes: tuple[str, ...], tag: str) -> Chunk:
    """Mean seconds per reserve (its settle untimed) of `count` reserves under `scopes`."""

    def chunk(start: int, count: int) -> float:
        spent = 0.0
        for i in range(start, start + count):
            t0 = time.perf_counter()
            res = ledger.reserve(f"{tag}-{i}", "alpha/m0", input_bytes=2000, scopes=scopes)
            spent += time.perf_counter() - t0
            ledger.settle(res.id, Success(input_tokens=500, output_tokens=200))
        return spent / count

    return chunk


def run(root: Path, settings: Settings) -> list[Row]:
    """Alternate plain and scoped reserves; the ratio per run."""
    ledger = open_ledger(make_home(root, "scopes"), bench_policy(scopes=SCOPES))
    try:
        warm = max(3, settings.cycles // 10)
        _reserve_chunk(ledger, (), "warm-plain")(0, warm)
        _reserve_chunk(ledger, NAMES, "warm-scoped")(0, warm)
        plain, scoped = side_by_side(
            _reserve_chunk(ledger, (), "plain"), _reserve_chunk(ledger, NAMES, "scoped"),
            settings, warm,
        )
    finally:
        ledger.close()
    ratio = Stats.of([s / p for s, p in zip(scoped, plain, strict=True)])
    rows = [
        time_row("scopes: plain reserve", Stats.of(plain)),
        time_row("scopes: reserve under 3 scopes", Stats.of(scoped)),
        ratio_row(
            "scopes: reserve under 3 scopes / plain reserve",
            ratio,
            f"<= {TARGET_RATIO:.1f}",
            ratio.median <= TARGET_RATIO,
        ),
    ]
    return rows + scope_burst.run(root / "burst", settings)  # issue 32: beside snipz
