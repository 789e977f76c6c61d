"""Figure `growth`: reserve+settle on a ledger holding a large history vs an empty ledger.

Invariant: the big ledger is built with stdlib executemany into a migrated database (sources,
source_models and settled reservations spread over 60 days, columns consistent with what the
ledger writes); both ledgers are then driven through the public API, in alternating chunks.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from bench.common import (
    MODEL_KEYS,
    Row,
    Settings,
    Stats,
    bench_policy,
    cycles_of,
    ledger_cycle,
    make_home,
    open_ledger,
    per_cycle,
    ratio_row,
    side_by_side,
    time_row,
)
from ledger.clock import now_ms
from ledger.store import sqlite_driver

DAY_MS = 86_400_000
DAYS = 60
TARGET_RATIO = 1.2
STATUS_TARGET_S = 0.3
COMPACT_BATCH = 5_000
ESTIMATE_TOKENS = (667, 4096)  # what a reserve of 2,000 bytes on a bench model estimates
OVERRUN_SHARE = 0.05  # of the successes: their output above the estimate
_STATUSES = ("succeeded",) * 16 + ("failed", "failed", "cancelled", "expired")


_HOUR = "(created_ms - created_ms % 3600000)"
_HOUR_TOTALS = (
    "INSERT INTO cost_hours (hour_start_ms, cost_micro, attempts)"
    f" SELECT {_HOUR}, sum(coalesce(cost_micro, 0)), count(*) FROM reservations GROUP BY {_HOUR}",
    "INSERT INTO token_hours (hour_start_ms, model_key, provider, input_tokens, output_tokens)"
    f" SELECT {_HOUR}, model_key, provider,"
    " sum(CASE WHEN input_tokens IS NULL THEN estimate_input_tokens ELSE input_tokens END),"
    " sum(coalesce(output_tokens, estimate_output_tokens))"
    f" FROM reservations GROUP BY {_HOUR}, model_key, provider",
)
_KEPT_TOTALS = tuple(  # the second (minute) totals a ledger keeps for 2 minutes (25 hours)
    (
        f"INSERT INTO {table} ({time}, model_key, provider, input_tokens, output_tokens)"
        f" SELECT created_ms - created_ms % {step}, model_key, provider,"
        " sum(CASE WHEN input_tokens IS NULL THEN estimate_input_tokens ELSE input_tokens END),"
        " sum(coalesce(output_tokens, estimate_output_tokens)) FROM reservations"
        f" WHERE created_ms >= ? GROUP BY created_ms - created_ms % {step}, model_key, provider",
        step,
        kept,
    )
    for table, time, step, kept in (
        ("token_seconds", "second_ms", 1000, 120_000),
        ("token_minutes", "minute_ms", 60_000, 25 * 3_600_000),
    )
)


def build_history(
    db_path: Path, rows: int, now: int, days: int = DAYS, seed: int = 7, *, analyze: bool = False
) -> None:
    """Insert `rows` historic attempts (4 per source, up to 2 models each) spread over `days`,
    each with the token estimate a reserve makes (R-TOK-2) and a few successes' usage above it,
    with the hour and second totals the ledger keeps. The ledger never gathers planner
    statistics; `analyze` runs ANALYZE as an operator might by hand (`analyzed`)."""
    rng = random.Random(seed)
    conn = sqlite_driver.connect(db_path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")  # building the fixture only; never measured
    conn.execute("BEGIN IMMEDIATE")
    span = days * DAY_MS
    batch_sources: list[tuple[object, ...]] = []
    batch_models: list[tuple[object, ...]] = []
    batch_res: list[tuple[object, ...]] = []

    def flush() -> None:
        conn.executemany(
            "INSERT INTO sources (id, state, in_queue, created_ms, last_checked_ms, failures,"
            " output_failures, backoff_steps, correction_used, finished_ms, archived_calls,"
            " archived_time_ms) VALUES (?, 'done', 0, ?, ?, ?, 0, 0, 0, ?, 0, 0)",
            batch_sources,
        )
        conn.executemany(
            "INSERT INTO source_models (source_id, model_key, first_ms) VALUES (?, ?, ?)",
            batch_models,
        )
        conn.executemany(
            "INSERT INTO reservations (source_id, model_key, provider, role, created_ms,"
            " deadline_ms, input_bytes, estimate_micro, status, settled_ms, duration_ms, kind,"
            " late, side_effects, input_tokens, output_tokens, actual_micro, cost_micro,"
            " policy_fp, estimate_input_tokens, estimate_output_tokens, overrun_ms) VALUES (?, ?,"
            " ?, ?, ?, ?, 2000, 9000, ?, ?, ?, ?, 0, 0, ?, ?, ?, ?, 'history', ?, ?, ?)",
            batch_res,
        )
        batch_sources.clear()
        batch_models.clear()
        batch_res.clear()

    for s in range(rows // 4):
        start = now - span + rng.randrange(span - 60_000)
        sid = f"hist-{s}"
        models = rng.sample(MODEL_KEYS, 2)
        failures = 0
        t = start
        for k in range(4):
            key = models[0] if k < 2 else models[1]
            status = rng.choice(_STATUSES)
            failures += status == "failed"
            duration = rng.randrange(200, 30_000)
            settled = None if status == "expired" else t + duration
            tokens = (500, 200) if status == "succeeded" else (None, None)
            if status == "succeeded" and rng.random() < OVERRUN_SHARE:
                tokens = (500, ESTIMATE_TOKENS[1] + 300)  # usage above the estimate (R-TOK-3)
            actual = 900 if status == "succeeded" else None
            batch_res.append(
                (
                    sid,
                    key,
                    key.split("/", 1)[0],
                    "primary" if k == 0 else "fallback",
                    t,
                    t + 120_000,
                    status,
                    settled,
                    None if settled is None else duration,
                    "transport" if status == "failed" else None,
                    tokens[0],
                    tokens[1],
                    actual,
                    actual if actual is not None else 9000,
                    *ESTIMATE_TOKENS,
                    settled if (tokens[1] or 0) > ESTIMATE_TOKENS[1] else None,
                )
            )
            t += duration + 1
        batch_sources.append((sid, start, t, failures, t))
        batch_models.extend((sid, m, start) for m in models)
        if len(batch_res) >= 20_000:
            flush()
    flush()
    for statement in _HOUR_TOTALS:  # what reserve and settle keep: every hour's totals
        conn.execute(statement)
    for statement, step, kept in _KEPT_TOTALS:
        conn.execute(statement, (now - now % step - kept,))
    conn.execute("UPDATE clock SET newest_ms = max(newest_ms, ?)", (now,))
    conn.execute("COMMIT")
    if analyze:
        conn.execute("ANALYZE")
    conn.close()


def analyzed(db_path: Path) -> None:
    """Gather SQLite's planner statistics on a ledger file, as an operator running ANALYZE by
    hand would: with STAT4 samples SQLite re-plans a statement whenever a bound value might change
    its plan, i.e. on nearly every reserve (the ledger's statements are planned for no
    statistics and never gather any)."""
    conn = sqlite_driver.connect(db_path, isolation_level=None)
    try:
        conn.execute("ANALYZE")
    finally:
        conn.close()


def _side_by_side(big: Path, empty: Path, settings: Settings, daily: bool) -> Stats:
    policy = bench_policy(**({"dailyEstimatedUsd": 10**9} if daily else {}))
    led_big, led_empty = open_ledger(big, policy), open_ledger(empty, policy)
    try:
        per_cycle(lambda i: ledger_cycle(led_big, i), 0, 5)
        per_cycle(lambda i: ledger_cycle(led_empty, i), 0, 5)
        big_s, empty_s = side_by_side(cycles_of(led_big), cycles_of(led_empty), settings, 5)
        ratios = [b / e for b, e in zip(big_s, empty_s, strict=True)]
    finally:
        led_big.close()
        led_empty.close()
    return Stats.of(ratios)


def _compaction(home: Path) -> tuple[list[float], int]:
    """Compact the history with the default 30 d age; seconds per batch transaction."""
    from ledger.store.compact import compact_step

    ledger = open_ledger(home)
    times: list[float] = []
    folded = 0
    try:
        while True:
            t0 = time.perf_counter()
            n = compact_step(ledger.db, now_ms(), 30 * DAY_MS, batch=COMPACT_BATCH)
            if n == 0:
                break
            times.append(time.perf_counter() - t0)
            folded += n
    finally:
        ledger.close()
    return times, folded


def _status_in_process(home: Path, runs: int) -> Stats:
    from ledger.status.document import build_status

    times: list[float] = []
    for _ in range(runs):
        ledger = open_ledger(home)
        t0 = time.perf_counter()
        json.dumps(build_status(ledger), default=str)
        times.append(time.perf_counter() - t0)
        ledger.close()
    return Stats.of(times)


def _status_cli(home: Path, runs: int) -> Stats:
    times: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "ledger", "--home", str(home), "status", "--json"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        times.append(time.perf_counter() - t0)
    return Stats.of(times)


def _startup(runs: int) -> Stats:
    times: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import ledger.cli.main"], check=True)
        times.append(time.perf_counter() - t0)
    return Stats.of(times)


def run(root: Path, settings: Settings) -> list[Row]:
    """Build the history, compare cycles, time status on it, then compact it."""
    big, empty = make_home(root, "growth-big"), make_home(root, "growth-empty")
    open_ledger(big).close()
    open_ledger(empty).close()
    t0 = time.perf_counter()
    build_history(big / "ledger.db", settings.growth_rows, now_ms())
    built = time.perf_counter() - t0
    label = f"{settings.growth_rows:,} attempts / {DAYS} d"
    plain = _side_by_side(big, empty, settings, daily=False)
    daily = _side_by_side(big, empty, settings, daily=True)
    analyzed(big / "ledger.db")
    after_analyze = _side_by_side(big, empty, settings, daily=False)
    status = _status_in_process(big, settings.status_runs)
    target = f"<= {STATUS_TARGET_S * 1000:.0f} ms"
    rows = [
        ratio_row(
            f"growth: cycle on {label} vs empty",
            plain,
            f"<= {TARGET_RATIO}",
            plain.median <= TARGET_RATIO,
            note=f"history built in {built:.1f} s",
        ),
        ratio_row(
            f"growth: same, with a daily USD ceiling set ({label})",
            daily,
            f"<= {TARGET_RATIO}",
            daily.median <= TARGET_RATIO,
            note="adds the rolling 24 h cost sum",
        ),
        ratio_row(
            f"growth: cycle on {label} vs empty, after a manual ANALYZE of the big file",
            after_analyze,
            "",
            None,
            note="planner statistics: SQLite re-plans statements; the ledger never gathers them",
        ),
        time_row(
            f"status: build_status + JSON in-process ({label})",
            status,
            target,
            status.median <= STATUS_TARGET_S,
        ),
    ]
    if not settings.quick:  # subprocesses cost seconds of interpreter start-up: not in smoke runs
        cli = _status_cli(big, settings.status_runs)
        startup = _startup(settings.status_runs)
        rows += [
            time_row(
                f"status: `ledger status --json` subprocess ({label})",
                cli,
                target,
                cli.median <= STATUS_TARGET_S,
            ),
            time_row("python + `import ledger.cli.main` (start-up share of the above)", startup),
        ]
    batch_times, folded = _compaction(big)
    batches = Stats.of(batch_times or [0.0])
    rows.append(
        time_row(
            f"compaction --older-than 30d: one batch of {COMPACT_BATCH:,} (write lock held)",
            batches,
        ).with_note(
            f"{folded:,} rows folded in {sum(batch_times):.1f} s; max batch "
            f"{batches.high * 1000:.0f} ms"
        )
    )
    return rows
