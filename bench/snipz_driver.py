"""The scope burst (issue 32) on snipz, run by a Python >= 3.13 interpreter that has snipz.

Stdlib only at import time: the ledger side of the figure (bench/scope_burst.py) imports the
plan and the usages from here, so both libraries reserve the same estimates and commit the same
deterministic real usages. snipz itself is imported only inside `main()`, under the 3.13
interpreter of its own venv (`python -I bench/snipz_driver.py DB PROCS ATTEMPTS LIMIT_USD
[SYNC]`); it prints one JSON object on stdout. SYNC "default" keeps snipz's own SQLite pragmas
(WAL, synchronous=NORMAL); "FULL" swaps in synchronous=FULL, ledger's setting, for a second
figure at the same durability (snipz has no option for it, so its pragma list is replaced).

Invariant: as the ledger side, every child starts reserving after a barrier, holds what it was
granted until every child has finished reserving (a second barrier), then commits each grant's
real usage; times are `time.monotonic()` (one system-wide clock on Linux, so comparable across
processes); the totals are read back from snipz's own database after the children end.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from typing import Any

from ledger.store import sqlite_driver

PROCS = 16
ATTEMPTS = 1000
LIMIT_USD = 5
QUICK_PROCS = 4
QUICK_ATTEMPTS = 160
QUICK_LIMIT_USD = 1
REPLY_TOKENS = 4096  # the bench model's reply allowance: what a reservation estimates
OUTPUT_USD_PER_MTOK = 2  # alpha/m0 of bench.common.bench_catalog (no input is sent)
ESTIMATE_MICRO = REPLY_TOKENS * OUTPUT_USD_PER_MTOK  # 8192 micro-USD
BARRIER_TIMEOUT_S = 600.0


def attempts_of(child: int, procs: int, attempts: int) -> int:
    """How many of `attempts` child `child` of `procs` makes (they differ by at most one)."""
    return attempts // procs + (1 if child < attempts % procs else 0)


def usage_tokens(child: int, i: int) -> int:
    """The real reply tokens of child `child`'s `i`-th grant: deterministic, 1..REPLY_TOKENS."""
    return 1 + (child * 7919 + i * 104_729) % REPLY_TOKENS


def cost_micro(tokens: int) -> int:
    """Micro-USD of a reply of `tokens` output tokens on the bench model."""
    return tokens * OUTPUT_USD_PER_MTOK


def _snipz_module(name: str) -> Any:
    # imported by name: snipz exists only in the 3.13 venv, never where mypy checks the bench
    import importlib

    return importlib.import_module(name)


def _snipz() -> Any:
    return _snipz_module("snipz")


def _durability(sync: str) -> None:
    if sync == "default":
        return
    sqlite_backend = _snipz_module("snipz.storage.sqlite")
    sqlite_backend._PRAGMAS = tuple(
        f"PRAGMA synchronous = {sync}" if "synchronous" in p else p
        for p in sqlite_backend._PRAGMAS
    )


def _child(
    n: int, barrier: Any, out: Any, db: str, procs: int, attempts: int, sync: str
) -> None:
    import asyncio
    from decimal import Decimal

    snipz = _snipz()
    _durability(sync)
    scope = snipz.Scope("scope", "burst", window="day")
    estimate = Decimal(ESTIMATE_MICRO) / Decimal(10_000)  # cents
    budget = snipz.Budget(db)
    report: dict[str, Any] = {"granted": 0, "refused": 0, "errors": []}

    async def reserve_all() -> list[Any]:
        held = []
        for _ in range(attempts_of(n, procs, attempts)):
            try:
                held.append(await budget.reserve(scope, estimate, model="m0", provider="alpha"))
            except snipz.BudgetExceededError:
                report["refused"] += 1
            except Exception as error:  # e.g. sqlite3 "database is locked" past busy_timeout
                report["errors"].append(f"{type(error).__name__}: {error}"[:200])
        return held

    async def commit_all(held: list[Any]) -> None:
        for i, reservation in enumerate(held):
            cents = Decimal(cost_micro(usage_tokens(n, i))) / Decimal(10_000)
            try:
                await reservation.commit(cents)
            except Exception as error:
                report["errors"].append(f"commit {type(error).__name__}: {error}"[:200])

    try:
        barrier.wait(timeout=BARRIER_TIMEOUT_S)
        report["start"] = time.monotonic()
        held = asyncio.run(reserve_all())
        report["reserved"] = time.monotonic()
        report["granted"] = len(held)
        barrier.wait(timeout=BARRIER_TIMEOUT_S)
        report["commit_start"] = time.monotonic()
        asyncio.run(commit_all(held))
        report["committed"] = time.monotonic()
    except Exception as error:  # reported, never swallowed
        report["errors"].append(f"{type(error).__name__}: {error}"[:200])
    out.put(report)


def _totals(db: str) -> dict[str, Any]:
    from decimal import Decimal

    con = sqlite_driver.connect(db)
    try:
        rows = con.execute(
            "SELECT state, CAST(estimated_cents AS TEXT), CAST(actual_cents AS TEXT)"
            " FROM snipz_ledger WHERE scope_id = 'burst'"
        ).fetchall()
        journal = con.execute("PRAGMA journal_mode").fetchone()[0]  # WAL persists in the file
    finally:
        con.close()
    granted = sum((Decimal(est) for _, est, _ in rows), Decimal(0))
    committed = sum((Decimal(act) for st, _, act in rows if st == "committed"), Decimal(0))
    return {
        "rows": len(rows),
        "open": sum(1 for st, _, _ in rows if st == "reserved"),
        "granted_micro": int(granted * 10_000),
        "committed_micro": int(committed * 10_000),
        "journal_mode": journal,
    }


def main(argv: list[str]) -> int:
    """Set up a fresh snipz database with the day limit, run the burst, print the totals."""
    import asyncio
    from decimal import Decimal

    snipz = _snipz()
    db, procs, attempts, limit_usd = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    sync = argv[4] if len(argv) > 4 else "default"
    _durability(sync)

    async def setup() -> None:
        budget = snipz.Budget(db)
        await budget.migrate()
        await budget.set_limit(snipz.Scope("scope", "burst", window="day"),
                               Decimal(limit_usd * 100))
        await budget.close()

    asyncio.run(setup())
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    children = [
        ctx.Process(target=_child, args=(n, barrier, out, db, procs, attempts, sync))
        for n in range(procs)
    ]
    for child in children:
        child.start()
    reports = [out.get(timeout=BARRIER_TIMEOUT_S * 2) for _ in children]
    for child in children:
        child.join()
    print(json.dumps({
        "version": snipz.__version__,
        "python": sys.version.split()[0],
        "reports": reports,
        **_totals(db),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
