"""Shared benchmark plumbing: statistics, the bench catalog and policy, scratch ledgers.

Invariant: every figure reports the median of several runs and their spread; ratios are formed
from runs taken side by side (interleaved) in the same process and on the same disk.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.records import Success
from ledger.worker.port import WorkerLedger

BIG = 10**9  # budgets so large that nothing refuses during a benchmark


@dataclass(frozen=True)
class Settings:
    """How much work each figure does (`--quick` shrinks everything for CI)."""

    quick: bool
    runs: int
    cycles: int
    contention_s: float
    select_calls: int
    growth_rows: int
    status_runs: int
    worker_items: int

    @classmethod
    def make(cls, quick: bool) -> Settings:
        """Full or quick settings."""
        if quick:
            return cls(True, 3, 10, 0.4, 20, 5_000, 2, 5)
        return cls(False, 7, 200, 4.0, 300, 1_000_000, 5, 100)


@dataclass(frozen=True)
class Stats:
    """Median and range of repeated measurements."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        """Summarise a non-empty series."""
        return cls(statistics.median(values), min(values), max(values), len(values))

    def spread_pct(self) -> float:
        """Half the range as a percentage of the median."""
        if self.median == 0:
            return 0.0
        return 50.0 * (self.high - self.low) / abs(self.median)


@dataclass(frozen=True)
class Row:
    """One line of the results table."""

    figure: str
    value: str
    spread: str
    target: str = ""
    met: bool | None = None
    note: str = ""

    def with_note(self, note: str) -> Row:
        """The same row with a note."""
        return Row(self.figure, self.value, self.spread, self.target, self.met, note)


def ms(seconds: float) -> str:
    """Seconds as milliseconds text."""
    return f"{seconds * 1000:.3f} ms"


def time_row(figure: str, stats: Stats, target: str = "", met: bool | None = None) -> Row:
    """A row for a duration in seconds."""
    return Row(
        figure, ms(stats.median), f"±{stats.spread_pct():.1f}% (n={stats.runs})", target, met
    )


def ratio_row(figure: str, stats: Stats, target: str, met: bool | None, note: str = "") -> Row:
    """A row for a dimensionless ratio."""
    return Row(
        figure,
        f"{stats.median:.2f}x",
        f"{stats.low:.2f}-{stats.high:.2f} (n={stats.runs})",
        target,
        met,
        note,
    )


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


BENCH_PROVIDERS = ("alpha", "beta", "gamma", "delta")


def bench_catalog(base_url: str = "http://127.0.0.1:9/v1", models_per_provider: int = 2) -> Catalog:
    """A small priced catalog whose providers are all available."""
    providers = {
        name: {"available": True, "api": "openai-chat", "baseUrl": base_url}
        for name in BENCH_PROVIDERS
    }
    models = [
        {
            "provider": name,
            "id": f"m{i}",
            "contextWindow": 128_000,
            "maxOutputTokens": 4096,
            "pricing": [{"inputUsdPerMTok": 1 + i, "outputUsdPerMTok": 2 + i}],
        }
        for name in BENCH_PROVIDERS
        for i in range(models_per_provider)
    ]
    return Catalog.model_validate({"providers": providers, "models": models})


def bench_policy(**extra: Any) -> Policy:
    """Budgets so large nothing refuses (many sources, many calls)."""
    keys: dict[str, Any] = {
        "callsPerHour": BIG,
        "sourceCalls": BIG,
        "sourceModels": 100,
        "sourceTimeMs": BIG,
        "timeoutMs": 120_000,
    }
    keys.update(extra)
    return Policy.model_validate(keys)


def make_home(root: Path, name: str) -> Path:
    """A fresh state directory under `root`."""
    home = root / name
    home.mkdir(mode=0o700, parents=True)
    (home / "catalog.json").write_text(json.dumps(bench_catalog().to_json()))
    return home


def open_ledger(
    home: Path,
    policy: Policy | None = None,
    catalog: Catalog | None = None,
    db: str | None = None,
) -> Ledger:
    """Open (and on first use create) a ledger in `home` with bench policy and catalog; `db` is
    a database URL (PostgreSQL for the fleet figure), else ledger.db in `home`."""
    return Ledger.open(
        home, db, policy=policy or bench_policy(), catalog=catalog or bench_catalog(), env={}
    )


MODEL_KEYS = tuple(f"{p}/m{i}" for p in BENCH_PROVIDERS for i in range(2))


def ledger_cycle(
    ledger: WorkerLedger, i: int, sources: int = 1000, prefix: str = "src"
) -> None:
    """One reserve + settle(success) through the public API."""
    res = ledger.reserve(
        f"{prefix}-{i % sources}", MODEL_KEYS[i % len(MODEL_KEYS)], input_bytes=2000
    )
    ledger.settle(res.id, Success(input_tokens=500, output_tokens=200))


CHUNK = 10  # cycles on one side before switching, so a change in disk load hits both alike
Chunk = Callable[[int, int], float]  # (first index, count) -> mean seconds per cycle


def side_by_side(
    first: Chunk, second: Chunk, settings: Settings, start: int, chunk: int = CHUNK
) -> tuple[list[float], list[float]]:
    """Per run, the mean seconds per cycle of both sides, measured alternately in chunks of
    `chunk` cycles (`settings.cycles`: each side's whole run in one block)."""
    firsts: list[float] = []
    seconds: list[float] = []
    offset = start
    for _ in range(settings.runs):
        a = b = 0.0
        done = 0
        while done < settings.cycles:
            n = min(chunk, settings.cycles - done)
            a += n * first(offset, n)
            b += n * second(offset, n)
            offset += n
            done += n
        firsts.append(a / done)
        seconds.append(b / done)
    return firsts, seconds


def cycles_of(ledger: WorkerLedger) -> Chunk:
    """The chunk function of reserve+settle cycles on one ledger."""
    return lambda start, count: per_cycle(lambda i: ledger_cycle(ledger, i), start, count)


def per_cycle(fn: Callable[[int], None], start: int, count: int) -> float:
    """Mean seconds per call of fn(i) for i in [start, start + count)."""
    t0 = time.perf_counter()
    for i in range(start, start + count):
        fn(i)
    return (time.perf_counter() - t0) / count


def run_together(
    target: Callable[..., None], procs: int, seconds: float, *args: Any, **kwargs: Any
) -> list[Any]:
    """Spawn `procs` children `target(n, barrier, out, *args, **kwargs)` that start their
    measured part together (after `barrier.wait()`) and each put one result on `out`."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    children = [
        ctx.Process(target=target, args=(n, barrier, out, *args), kwargs=kwargs)
        for n in range(procs)
    ]
    for child in children:
        child.start()
    results = [out.get(timeout=120 + seconds * 4) for _ in children]
    for child in children:
        child.join()
    return results
