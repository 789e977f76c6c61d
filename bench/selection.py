"""Figure `selection`: `Ledger.select` over a 1,000-model catalog with 200 active cooldowns.

Invariant: the time includes the read transaction (the snapshot), measured through the public API.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import Row, Settings, Stats, bench_policy, make_home, open_ledger, time_row
from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.records import Success
from ledger.store import sqlite_driver
from ledger.store.views import select_state

PROVIDERS = 50
MODELS_PER_PROVIDER = 20
COOLDOWNS = 200
TARGET_S = 0.002


def big_catalog() -> Catalog:
    """1,000 available text models across 50 providers, with varied prices and windows."""
    providers: dict[str, Any] = {
        f"p{p:02d}": {"available": True, "api": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1"}
        for p in range(PROVIDERS)
    }
    models: list[dict[str, Any]] = []
    for p in range(PROVIDERS):
        for m in range(MODELS_PER_PROVIDER):
            model: dict[str, Any] = {
                "provider": f"p{p:02d}",
                "id": f"model-{m:02d}",
                "contextWindow": 8_000 * (1 + (p + m) % 16),
                "maxOutputTokens": 4096,
                "reasoning": m % 3 == 0,
            }
            if (p + m) % 7:
                model["pricing"] = [
                    {"inputUsdPerMTok": 0.1 * (1 + m), "outputUsdPerMTok": 0.3 * (1 + p % 9)}
                ]
            models.append(model)
    return Catalog.model_validate({"providers": providers, "models": models})


def _add_cooldowns(ledger: Ledger, keys: list[str]) -> None:
    """Active cooldowns (every 20th on a whole provider) in one bulk transaction."""
    path = ledger.state.db_path
    assert path is not None
    now = ledger.db.clock_fn()
    rows = [
        ("provider", key.split("/", 1)[0]) if n % 20 == 0 else ("model", key)
        for n, key in enumerate(keys)
    ]
    conn = sqlite_driver.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT OR REPLACE INTO cooldowns (scope, target, origin, until_ms, kind, created_ms)"
            " VALUES (?, ?, 'manual', ?, 'manual', ?)",
            [(scope, target, now + 3_600_000, now) for scope, target in rows],
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def run(root: Path, settings: Settings) -> list[Row]:
    """Median time of `Ledger.select` (snapshot read + pure selection)."""
    catalog = big_catalog()
    default = "p00/model-01"
    ledger = open_ledger(make_home(root, "selection"), bench_policy(defaultModel=default), catalog)
    try:
        keys = [m.key for m in catalog.models]
        _add_cooldowns(ledger, keys[40 : 40 + COOLDOWNS])
        for i in range(8):  # a source with history
            res = ledger.reserve("with-history", keys[i % 2], input_bytes=4000)
            ledger.settle(res.id, Success(input_tokens=900, output_tokens=300))
        for _ in range(5):
            ledger.select("with-history", model=default, input_bytes=4000)
        times: list[float] = []
        reads: list[float] = []
        for _ in range(settings.select_calls):
            t0 = time.perf_counter()
            ledger.select("with-history", model=default, input_bytes=4000)
            t1 = time.perf_counter()
            select_state(ledger.db, "with-history", ledger.policy.calls_per_hour)
            times.append(t1 - t0)
            reads.append(time.perf_counter() - t1)
    finally:
        ledger.close()
    stats = Stats.of(times)
    snapshot = Stats.of(reads)
    return [
        time_row(
            "selection: 1,000 models, 200 cooldowns, source with history",
            stats,
            f"<= {TARGET_S * 1000:.0f} ms",
            stats.median <= TARGET_S,
        ),
        time_row("selection: of which the snapshot read transaction", snapshot),
    ]
