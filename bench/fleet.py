"""Figure `fleet` (issue 16): the same cycle and 8-process contention on SQLite and PostgreSQL.

Invariant: both backends run the same code path (`Ledger.reserve` + `settle` through the public
API) in the same run, alternating in chunks for the cycle so machine noise hits both alike; each
PostgreSQL run gets a fresh database on the server named by $LEDGER_BENCH_PG_URL (else
$LEDGER_TEST_PG_URL), dropped afterwards. Without a server the figure says so instead of a number.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.common import (
    Row,
    Settings,
    Stats,
    cycles_of,
    ledger_cycle,
    make_home,
    ms,
    open_ledger,
    per_cycle,
    ratio_row,
    side_by_side,
    time_row,
)
from bench.contention import percentile, run_round

PG_ENV = ("LEDGER_BENCH_PG_URL", "LEDGER_TEST_PG_URL")
PROCESSES = 8
QUICK_PROCESSES = 2


def server_url() -> str | None:
    """The PostgreSQL server to benchmark on, if one is configured."""
    for name in PG_ENV:
        if os.environ.get(name):
            return os.environ[name]
    return None


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """A new database on `server` for one figure; dropped afterwards."""
    base = make_url(server)
    name = f"ledger_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _server_version(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar_one()
            fsync = conn.execute(text("SHOW fsync")).scalar_one()
    finally:
        engine.dispose()
    return f"PostgreSQL {version}, fsync={fsync}"


def _cycles(root: Path, settings: Settings, pg: str) -> tuple[Stats, Stats, Stats]:
    """Per-cycle seconds on SQLite and PostgreSQL, alternating in chunks, and their ratio."""
    sqlite_led = open_ledger(make_home(root, "fleet-cycle-sqlite"))
    pg_led = open_ledger(make_home(root, "fleet-cycle-pg"), db=pg)
    try:
        warm = max(3, settings.cycles // 10)
        per_cycle(lambda i: ledger_cycle(sqlite_led, i), 0, warm)
        per_cycle(lambda i: ledger_cycle(pg_led, i), 0, warm)
        lite, post = side_by_side(cycles_of(sqlite_led), cycles_of(pg_led), settings, warm)
    finally:
        sqlite_led.close()
        pg_led.close()
    ratios = [p / s for p, s in zip(post, lite, strict=True)]
    return Stats.of(lite), Stats.of(post), Stats.of(ratios)


def _contention(
    root: Path, settings: Settings, pg: str, procs: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Total cycles/s of `procs` processes on one shared ledger per backend, rounds interleaved."""
    homes = {
        "sqlite": make_home(root, "fleet-cont-sqlite"),
        "postgresql": make_home(root, "fleet-cont-pg"),
    }
    dbs = {"sqlite": None, "postgresql": pg}
    for name, home in homes.items():
        open_ledger(home, db=dbs[name]).close()
    out: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in homes}
    runs = 1 if settings.quick else max(1, settings.runs // 2)
    for r in range(runs):
        for name, home in homes.items():
            rate, latencies = run_round(
                home, procs, settings.contention_s, f"f{r}{name[0]}", db=dbs[name]
            )
            out[name][0].append(rate)
            out[name][1].extend(latencies)
    return out


def run(root: Path, settings: Settings) -> list[Row]:
    """Cycle and contention rows for both backends, and PostgreSQL relative to SQLite."""
    server = server_url()
    if server is None:
        return [Row("fleet: PostgreSQL beside SQLite", "skipped", "",
                    note="set LEDGER_BENCH_PG_URL (scripts/pg-test-server.sh)")]
    procs = QUICK_PROCESSES if settings.quick else PROCESSES
    with fresh_database(server) as pg_cycle, fresh_database(server) as pg_cont:
        version = _server_version(pg_cycle)
        lite, post, ratio = _cycles(root, settings, pg_cycle)
        contention = _contention(root, settings, pg_cont, procs)
    rows = [
        time_row("fleet cycle: SQLite reserve+settle", lite),
        time_row("fleet cycle: PostgreSQL reserve+settle", post).with_note(version),
        ratio_row("fleet cycle: PostgreSQL / SQLite", ratio, "", None),
    ]
    for name, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        values, latencies = contention[name]
        stats = Stats.of(values)
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        rows.append(Row(
            f"fleet contention: {procs} processes on {label}, total cycles/s",
            f"{stats.median:.0f}/s",
            f"{stats.low:.0f}-{stats.high:.0f} (n={stats.runs})",
            note=f"reserve p50 {ms(p50)}, p99 {ms(p99)}",
        ))
    pairs = zip(contention["postgresql"][0], contention["sqlite"][0], strict=True)
    rel = Stats.of([p / s for p, s in pairs])
    figure = f"fleet contention: PostgreSQL / SQLite ({procs} processes)"
    rows.append(ratio_row(figure, rel, "", None))
    return rows
