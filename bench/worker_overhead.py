"""Figure `worker overhead`: queue items against the local stand-in answering instantly.

Invariant: the provider call is timed where it happens (inside the handler, or around the adapter
call by hand); the ledger's share is everything else in the item's wall time.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import (
    Row,
    Settings,
    Stats,
    bench_catalog,
    bench_policy,
    make_home,
    ms,
    open_ledger,
)
from ledger.api import Ledger
from ledger.providers.base import CallRequest, Message
from ledger.providers.registry import adapter_for
from ledger.records import Success
from ledger.standin.server import StandIn


def _by_hand(ledger: Ledger, items: int, tag: str) -> tuple[list[float], list[float]]:
    """reserve + adapter call + settle, timed per item: (wall, call) seconds."""
    model = ledger.model("alpha/m0")
    adapter = adapter_for(ledger.catalog.providers[model.provider], ledger.env)
    walls: list[float] = []
    calls: list[float] = []
    for i in range(items):
        t0 = time.perf_counter()
        res = ledger.reserve(f"{tag}-{i}", model.key, input_bytes=600)
        t1 = time.perf_counter()
        reply = adapter.call(
            CallRequest(model.id, (Message("user", "{}"),), 256, res.deadline_ms),
            now_ms=ledger.db.clock_fn,
        )
        t2 = time.perf_counter()
        ledger.settle(res.id, Success(reply.input_tokens, reply.output_tokens, finish=True))
        walls.append(time.perf_counter() - t0)
        calls.append(t2 - t1)
    return walls, calls


def _with_worker(ledger: Ledger, items: int) -> tuple[list[float], list[float]] | None:
    """Queue items drained by ledger.worker.runner with a timing echo handler, or None if absent."""
    try:
        from ledger.worker.queue import HandlerResult
        from ledger.worker.runner import Job, drain, echo_handler
    except ImportError:
        return None
    call_times: list[float] = []

    def handler(job: Job) -> HandlerResult:
        t0 = time.perf_counter()
        result = echo_handler(job)
        call_times.append(time.perf_counter() - t0)
        return result

    for i in range(items):
        ledger.add_source(f"item-{i}", payload_ref='{"n": 1}')
    walls: list[float] = []
    for _ in range(items):
        t0 = time.perf_counter()
        drain(ledger, handler, worker_id="bench", max_items=1)
        walls.append(time.perf_counter() - t0)
    return walls, call_times


def _share(walls: list[float], calls: list[float]) -> Stats:
    return Stats.of([(w - c) / w for w, c in zip(walls, calls, strict=True)])


def run(root: Path, settings: Settings) -> list[Row]:
    """The ledger's share of an item's wall time when the provider answers instantly."""
    rows: list[Row] = []
    with StandIn() as standin:
        catalog = bench_catalog(standin.base_url_openai)
        ledger = open_ledger(
            make_home(root, "worker"), bench_policy(defaultModel="alpha/m0"), catalog
        )
        try:
            _by_hand(ledger, 3, "warm")
            walls, calls = _by_hand(ledger, settings.worker_items, "hand")
            share = _share(walls, calls)
            rows.append(
                Row(
                    "worker overhead: reserve + adapter call + settle (by hand)",
                    f"{share.median * 100:.0f}% ledger",
                    f"{share.low * 100:.0f}-{share.high * 100:.0f}% (n={share.runs})",
                    note=f"item {ms(Stats.of(walls).median)}, call {ms(Stats.of(calls).median)}",
                )
            )
            drained = _with_worker(ledger, settings.worker_items)
            if drained is None:
                rows.append(
                    Row("worker overhead: ledger.worker.runner", "n/a", "", note="no worker yet")
                )
            else:
                walls, calls = drained
                if len(calls) == len(walls):
                    share = _share(walls, calls)
                    rows.append(
                        Row(
                            "worker overhead: one queue item via ledger.worker.runner.drain",
                            f"{share.median * 100:.0f}% ledger",
                            f"{share.low * 100:.0f}-{share.high * 100:.0f} % (n={share.runs})",
                            note=f"item {ms(Stats.of(walls).median)}, "
                            f"call {ms(Stats.of(calls).median)}; claim+select+reserve+settle"
                            "+release",
                        )
                    )
        finally:
            ledger.close()
    return rows
