"""Figure `fleet-serve` (issue 46 item 4): 1, 2 and 4 `ledger serve` processes on one PostgreSQL
database, each with 8 `LedgerClient` threads doing reserve+settle cycles; total cycles per second,
and the hourly budget exact at the end.

Each round is one fresh database and a `callsPerHour` limit L reachable within the round: every
client thread cycles until it is refused `shared_hourly_budget`, and then the database itself
(a direct count, not the services' word) must hold exactly L reservations in the hour: none
granted past the limit (overshoot) and none refused below it (under-grant). Cycles per second are
the L cycles over the wall time from the first thread's start to the last thread's refusal.

Invariant: every service is a real `ledger serve` subprocess (tests/support/serving.py) on a state
directory of its own, all with the same catalog, the same recovery.json and `--db` the same
database; the clients of each service run in a process of their own (8 threads, one
`LedgerClient` each), started together behind a barrier; rounds of 1, 2 and 4 services are
interleaved so machine noise hits them alike; services are stopped by pid and databases dropped.
Without a PostgreSQL server (bench/fleet.py) the figure says so instead of a number.
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench.common import Row, Settings, Stats, bench_policy, make_home, ms, open_ledger, ratio_row
from bench.contention import percentile
from bench.fleet import fresh_database, server_url
from ledger.errors import LedgerError, Refused
from ledger.kinds import RefusalReason
from ledger.records import Success
from tests.support.serving import running

SERVICES = (1, 2, 4)
QUICK_SERVICES = (1, 2)
CLIENTS = 8
QUICK_CLIENTS = 2
LIMIT = 3_000
QUICK_LIMIT = 200
ROUNDS = 3
HOUR_MS = 3_600_000
MODEL = "alpha/m0"


def _thread(socket: str, tag: str, go: threading.Event, out: list[dict[str, Any]]) -> None:
    """Cycle until refused for the hourly budget; what happened goes on `out`."""
    from ledger.client import LedgerClient  # lazy: the client process's own import

    client = LedgerClient(socket)
    granted = 0
    refused: Counter[str] = Counter()
    errors: list[str] = []
    latencies: list[float] = []
    go.wait()
    start = time.monotonic()
    i = 0
    try:
        while True:
            i += 1
            t0 = time.perf_counter()
            try:
                res = client.reserve(f"{tag}-{i % 50}", MODEL, input_bytes=2000)
            except Refused as refusal:
                refused[refusal.reason] += 1
                if refusal.reason == RefusalReason.SHARED_HOURLY_BUDGET:
                    break
                continue
            except LedgerError as error:
                errors.append(type(error).__name__)
                if len(errors) > 20:
                    break
                continue
            latencies.append(time.perf_counter() - t0)
            granted += 1
            client.settle(res.id, Success(input_tokens=500, output_tokens=200))
    finally:
        client.close()
    out.append({"granted": granted, "refused": dict(refused), "errors": errors,
                "start": start, "end": time.monotonic(), "latencies": latencies})


def _driver(n: int, barrier: Barrier, out: Queue[Any], socket: str, clients: int) -> None:
    """One service's clients: `clients` threads started together once every driver is ready."""
    go = threading.Event()
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=_thread, args=(socket, f"s{n}c{c}", go, results))
               for c in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    go.set()
    for thread in threads:
        thread.join()
    out.put(results)


@dataclass(frozen=True)
class Round:
    """One round: cycles/s, what the clients were granted, what the database holds."""

    per_second: float
    granted: int
    in_hour: int
    total: int
    still_open: int
    errors: list[str]
    refused_other: int
    latencies: list[float]


def _count(url: str) -> tuple[int, int, int]:
    """The database's own count: reservations in the hour, all, and those not settled."""
    since = int(time.time() * 1000) - HOUR_MS
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            in_hour = conn.execute(text(
                "SELECT count(*) FROM reservations WHERE created_ms > :since"
            ), {"since": since}).scalar_one()
            total = conn.execute(text("SELECT count(*) FROM reservations")).scalar_one()
            still_open = conn.execute(text(
                "SELECT count(*) FROM reservations WHERE status = 'open'"
            )).scalar_one()
    finally:
        engine.dispose()
    return int(in_hour), int(total), int(still_open)


def _round(server: str, services: int, clients: int, limit: int) -> Round:
    policy = bench_policy(callsPerHour=limit)
    with tempfile.TemporaryDirectory(prefix="ledger-fs-") as short, \
            fresh_database(server) as url:  # a socket path must stay short: under /tmp
        homes = []
        for k in range(services):
            home = make_home(Path(short), f"s{k}")
            (home / "recovery.json").write_text(json.dumps(policy.to_json()))
            homes.append(home)
        open_ledger(homes[0], policy=policy, db=url).close()  # migrated before the services
        with ExitStack() as stack:
            served = [stack.enter_context(running(home, db=url)) for home in homes]
            ctx = multiprocessing.get_context("spawn")
            barrier = ctx.Barrier(services)
            out: Queue[Any] = ctx.Queue()
            drivers = [ctx.Process(target=_driver, args=(k, barrier, out, str(s.socket), clients))
                       for k, s in enumerate(served)]
            for driver in drivers:
                driver.start()
            reports = [t for _ in drivers for t in out.get(timeout=1800)]
            for driver in drivers:
                driver.join(60)
        in_hour, total, still_open = _count(url)
    granted = sum(r["granted"] for r in reports)
    wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    other = sum(n for r in reports for reason, n in r["refused"].items()
                if reason != RefusalReason.SHARED_HOURLY_BUDGET)
    return Round(granted / wall, granted, in_hour, total, still_open,
                 [e for r in reports for e in r["errors"]], other,
                 [lat for r in reports for lat in r["latencies"]])


def run(root: Path, settings: Settings) -> list[Row]:
    """Rounds of 1, 2 and 4 services (quick: 1 and 2), interleaved; rates and exactness."""
    server = server_url()
    if server is None:
        return [Row("fleet-serve: ledger serve processes on one PostgreSQL database", "skipped",
                    "", note="no PostgreSQL server: set LEDGER_BENCH_PG_URL "
                    "(scripts/pg-test-server.sh)")]
    counts = QUICK_SERVICES if settings.quick else SERVICES
    clients = QUICK_CLIENTS if settings.quick else CLIENTS
    limit = QUICK_LIMIT if settings.quick else LIMIT
    rounds: dict[int, list[Round]] = {n: [] for n in counts}
    for _ in range(1 if settings.quick else ROUNDS):
        for n in counts:
            rounds[n].append(_round(server, n, clients, limit))
    return _rows(rounds, clients, limit)


def _rows(rounds: dict[int, list[Round]], clients: int, limit: int) -> list[Row]:
    rows = []
    for n, done in rounds.items():
        rate = Stats.of([r.per_second for r in done])
        pooled = [lat for r in done for lat in r.latencies]
        rows.append(Row(
            f"fleet-serve: {n} service(s) x {clients} clients on one PostgreSQL, total cycles/s",
            f"{rate.median:.0f}/s", f"{rate.low:.0f}-{rate.high:.0f} (n={rate.runs})",
            note=f"reserve p50 {ms(percentile(pooled, 0.5))}, p99 {ms(percentile(pooled, 0.99))}",
        ))
        if n != min(rounds):
            one = rounds[min(rounds)]
            rel = Stats.of([r.per_second / o.per_second for r, o in zip(done, one, strict=True)])
            rows.append(ratio_row(f"fleet-serve: {n} services / 1, total cycles/s", rel, "",
                                  None))
    every = [r for done in rounds.values() for r in done]
    exact = all(r.in_hour == limit == r.granted and r.still_open == 0 and not r.errors
                for r in every)
    counted = sorted({r.in_hour for r in every})
    kinds = sorted({e for r in every for e in r.errors})
    note = (f"clients granted {sorted({r.granted for r in every})}, database total "
            f"{sorted({r.total for r in every})}, left open "
            f"{sorted({r.still_open for r in every})}, other refusals "
            f"{sum(r.refused_other for r in every)}, errors "
            f"{sum(len(r.errors) for r in every)} {kinds}")
    rows.append(Row(
        f"fleet-serve: reservations in the hour (database count) vs callsPerHour L={limit:,}",
        ", ".join(f"{c:,}" for c in counted), f"{len(every)} rounds",
        "= L exactly", exact, note,
    ))
    return rows
