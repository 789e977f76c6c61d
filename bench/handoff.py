"""Figure `handoff`: where a contended write transaction's time goes (issue 14).

Invariant: every round is real processes on one ledger, measured in the same run; each process
records, per write transaction, when it asked for the write lock, when it got it and when it let
it go (CLOCK_MONOTONIC, one clock for all processes). From those spans:
- *held*: lock granted to released, i.e. the transaction itself;
- *idle*: the lock free between one holder's release and the next holder's grant (the hand-off);
- *ceiling*: the throughput ratio a strictly fair lock could reach against one process at most,
  (held + idle at 1) / (held + idle at N), so the lock's own cost is told apart from the cost of
  running each transaction in a different process (cold caches);
- the same transaction in one process whose writes are a provider call apart (a real worker:
  its caches are cold whether or not anyone contends);
- for reference, N processes without the lock file (SQLite's busy handler alone): throughput
  comes back because one process runs many transactions in a row, and the tail goes.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from bench.common import Row, Settings, Stats, make_home, ms, open_ledger, ratio_row, run_together

CALL_S = 0.02  # a (very fast) provider call between a worker's reserve and settle
Span = tuple[int, int, int]  # asked, granted, released (ns, CLOCK_MONOTONIC)


def _instrument(spans: list[Span], no_lock: bool) -> None:
    """Record every write transaction's lock span in this (child) process."""
    from ledger.store import engine, writelock

    if no_lock:  # SQLite's busy handler alone, as before issue 14
        engine.lock_path = lambda _url: None  # type: ignore[attr-defined,assignment]
    original = writelock.WriteLock.held

    @contextlib.contextmanager
    def held(self: Any) -> Iterator[bool]:
        asked = time.monotonic_ns()
        with original(self) as locked:
            granted = time.monotonic_ns()
            try:
                yield locked
            finally:
                spans.append((asked, granted, time.monotonic_ns()))

    writelock.WriteLock.held = held  # type: ignore[method-assign]


def _child(
    n: int, barrier: Barrier, out: Queue[Any], home: str, tag: str, seconds: float, pause: float,
    no_lock: bool,
) -> None:
    tag = f"{tag}-p{n}"
    from ledger.records import Success

    spans: list[Span] = []
    _instrument(spans, no_lock)
    ledger = open_ledger(Path(home))
    ledger.settle(ledger.reserve(f"{tag}-warm", "alpha/m0").id, Success(1, 1))
    barrier.wait()
    spans.clear()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    cycles = 0
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        res = ledger.reserve(f"{tag}-{cycles % 500}", "alpha/m0", input_bytes=2000)
        latencies.append(time.perf_counter() - t0)
        if pause:
            time.sleep(pause)
        ledger.settle(res.id, Success(input_tokens=500, output_tokens=200))
        if pause:
            time.sleep(pause)
        cycles += 1
    ledger.close()
    out.put((cycles, spans, latencies))


def _round(
    home: Path, procs: int, seconds: float, tag: str, *, pause: float = 0.0, no_lock: bool = False
) -> dict[str, float]:
    results = run_together(_child, procs, seconds, str(home), tag, seconds, pause, no_lock)
    spans = sorted(span for r in results for span in r[1])
    held = [(released - granted) / 1e9 for _, granted, released in spans]
    idle = [max(0, spans[k + 1][1] - spans[k][2]) / 1e9 for k in range(len(spans) - 1)]
    latencies = sorted(lat for r in results for lat in r[2])
    return {
        "rate": sum(r[0] for r in results) / seconds,
        "held": statistics.median(held),
        "idle": statistics.median(idle) if idle else 0.0,
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "max": latencies[-1],
    }


def run(root: Path, settings: Settings) -> list[Row]:
    """One process, N fair-locked processes, one paced process and N unlocked ones, interleaved."""
    home = make_home(root, "handoff")
    open_ledger(home).close()
    n = 2 if settings.quick else 8
    seconds = settings.contention_s
    runs = 1 if settings.quick else max(1, settings.runs // 2)
    one, many, paced, unlocked = [], [], [], []
    for r in range(runs):
        one.append(_round(home, 1, seconds, f"h{r}a"))
        many.append(_round(home, n, seconds, f"h{r}b"))
        paced.append(_round(home, 1, seconds, f"h{r}c", pause=CALL_S))
        unlocked.append(_round(home, n, seconds, f"h{r}d", no_lock=True))

    def med(rounds: list[dict[str, float]], key: str) -> float:
        return statistics.median(x[key] for x in rounds)

    held_ratio = Stats.of([m["held"] / o["held"] for m, o in zip(many, one, strict=True)])
    ceiling = Stats.of([
        (o["held"] + o["idle"]) / (m["held"] + m["idle"]) for m, o in zip(many, one, strict=True)
    ])
    paced_ratio = Stats.of([p["held"] / o["held"] for p, o in zip(paced, one, strict=True)])
    free = Stats.of([u["rate"] / o["rate"] for u, o in zip(unlocked, one, strict=True)])
    return [
        ratio_row(
            f"handoff: lock held per write, {n} processes vs 1", held_ratio, "", None,
            note=f"median {ms(med(many, 'held'))} vs {ms(med(one, 'held'))}: the same "
            "transaction run by a different process each turn",
        ),
        Row(
            f"handoff: lock idle between holders, {n} processes", ms(med(many, "idle")),
            f"1 process: {ms(med(one, 'idle'))} between its own writes",
            note="release to the next holder's grant, median",
        ),
        ratio_row(
            f"handoff: fair-turn ceiling at {n} processes, (held+idle at 1)/(held+idle at {n})",
            ceiling, "", None,
            note="the best cycles/s ratio one transaction per turn allows on this machine",
        ),
        ratio_row(
            f"handoff: lock held per write, 1 process with a {CALL_S * 1000:.0f} ms call "
            "between writes vs back-to-back",
            paced_ratio, "", None,
            note=f"median {ms(med(paced, 'held'))}: a real worker's writes run cold anyway",
        ),
        ratio_row(
            f"handoff: {n} processes without the lock file (SQLite busy handler), cycles/s vs 1",
            free, "", None,
            note=f"reserve p99 {ms(med(unlocked, 'p99'))}, max {ms(_worst(unlocked))} (with the "
            f"lock: p99 {ms(med(many, 'p99'))}, max {ms(_worst(many))})",
        ),
    ]


def _worst(rounds: list[dict[str, float]]) -> float:
    return max(r["max"] for r in rounds)
