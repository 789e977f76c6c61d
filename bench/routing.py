"""Figures `routing` (issue 30): a reserve through a round-robin pool against a plain reserve, and
selection with 200 chains, 50 pools and 1,000 models.

Invariant: the two reserve sides alternate in chunks on two ledgers of the same shape in the same
process (same catalog, same policy but for the pool), so noise hits both alike; the selection time
includes its read transaction, through the public API.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import (
    MODEL_KEYS,
    Chunk,
    Row,
    Settings,
    Stats,
    bench_policy,
    make_home,
    open_ledger,
    per_cycle,
    ratio_row,
    side_by_side,
    time_row,
)
from bench.selection import big_catalog
from ledger.api import Ledger

TARGET_RATIO = 1.15
TARGET_SELECT_S = 0.002
POOL = {"rr": {"candidates": list(MODEL_KEYS[:4]), "strategy": "round-robin"}}


def _reserves(ledger: Ledger, model: str | None) -> Chunk:
    """Chunk: reserves on fresh sources, through `model` (a pool key) or the plain rotation."""

    def one(i: int) -> None:
        ledger.reserve(f"src-{i}", model or MODEL_KEYS[i % 4], input_bytes=2000)

    return lambda start, count: per_cycle(one, start, count)


def _reserve_rows(root: Path, settings: Settings) -> list[Row]:
    plain = open_ledger(make_home(root, "plain"), bench_policy(pools=POOL))
    pooled = open_ledger(make_home(root, "pooled"), bench_policy(pools=POOL))
    try:
        warm = max(3, settings.cycles // 10)
        _reserves(plain, None)(-warm, warm)
        _reserves(pooled, "pool/rr")(-warm, warm)
        plains, pools = side_by_side(
            _reserves(plain, None), _reserves(pooled, "pool/rr"), settings, 0
        )
    finally:
        plain.close()
        pooled.close()
    ratio = Stats.of([p / q for p, q in zip(pools, plains, strict=True)])
    return [
        time_row("routing: plain reserve", Stats.of(plains)),
        time_row("routing: reserve through a 4-candidate round-robin pool", Stats.of(pools)),
        ratio_row(
            "routing: pool reserve / plain reserve",
            ratio,
            f"<= {TARGET_RATIO}",
            ratio.median <= TARGET_RATIO,
        ),
    ]


def _routing_policy_keys(keys: list[str]) -> dict[str, object]:
    """200 chains (a glob per provider and exact keys), 50 pools of 4, over the 1,000 models."""
    pools = {f"pool{n:02d}": {"candidates": keys[n * 20 : n * 20 + 4], "strategy": "round-robin"}
             for n in range(50)}  # fmt: skip
    chains: dict[str, list[str]] = {}
    for p in range(50):
        chains[f"p{p:02d}/*"] = [f"pool/pool{(p + 1) % 50:02d}", keys[(p * 20 + 41) % 1000]]
    for n in range(150):
        chains[keys[n * 6]] = [keys[(n * 6 + 23) % 1000], f"pool/pool{n % 50:02d}"]
    return {"chains": chains, "pools": pools}


def _select_rows(root: Path, settings: Settings) -> list[Row]:
    catalog = big_catalog()
    keys = [m.key for m in catalog.models]
    policy = bench_policy(defaultModel="pool/pool00", **_routing_policy_keys(keys))
    ledger = open_ledger(make_home(root, "routing-select"), policy, catalog)
    plain_policy = bench_policy(defaultModel=keys[1])
    plain = open_ledger(make_home(root, "plain-select"), plain_policy, catalog)
    try:
        for _ in range(8):
            ledger.reserve("with-history", "pool/pool00", input_bytes=4000)
            plain.reserve("with-history", keys[1], input_bytes=4000)
        primaries = ["pool/pool00", keys[6], keys[45]]  # a pool, an exact chain, a glob chain
        for model in primaries:
            ledger.select("with-history", model=model, input_bytes=4000)
        plain.select("with-history", input_bytes=4000)
        times: list[float] = []
        plains: list[float] = []
        for n in range(settings.select_calls):
            t0 = time.perf_counter()
            ledger.select("with-history", model=primaries[n % 3], input_bytes=4000)
            t1 = time.perf_counter()
            plain.select("with-history", input_bytes=4000)
            times.append(t1 - t0)
            plains.append(time.perf_counter() - t1)
    finally:
        ledger.close()
        plain.close()
    stats = Stats.of(times)
    ratio = Stats.of([a / b for a, b in zip(times, plains, strict=True)])
    return [
        time_row(
            "routing: selection, 200 chains, 50 pools, 1,000 models",
            stats,
            f"<= {TARGET_SELECT_S * 1000:.0f} ms",
            stats.median <= TARGET_SELECT_S,
        ),
        ratio_row(
            "routing: that selection / the same catalog without chains or pools", ratio, "", None,
            note=f"plain selection {Stats.of(plains).median * 1000:.3f} ms",
        ),
    ]


def run(root: Path, settings: Settings) -> list[Row]:
    """Both routing figures."""
    return _reserve_rows(root, settings) + _select_rows(root, settings)
