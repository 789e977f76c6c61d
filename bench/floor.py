"""The physical floor: the reserve+settle work written directly on stdlib sqlite3.

Invariant: the same PRAGMAs as the ledger (synchronous=FULL, the journal mode the ledger chooses,
busy_timeout), the same migrated schema and disk; per cycle one BEGIN IMMEDIATE transaction that
counts the rolling hour and inserts, and one that marks the row settled.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from ledger.clock import now_ms
from ledger.store import sqlite_driver
from ledger.store.engine import chosen_journal_mode

HOUR_MS = 3_600_000

_INSERT = (
    "INSERT INTO reservations (source_id, model_key, provider, role, created_ms, deadline_ms,"
    " input_bytes, estimate_micro, status, cost_micro, late, side_effects, policy_fp)"
    " VALUES (?, ?, ?, 'primary', ?, ?, ?, ?, 'open', ?, 0, 0, 'floor')"
)
_SETTLE = (
    "UPDATE reservations SET status = 'succeeded', settled_ms = ?, duration_ms = ?,"
    " input_tokens = ?, output_tokens = ?, actual_micro = ?, cost_micro = ? WHERE id = ?"
)


def connect(path: Path, busy_timeout_ms: int = 10_000) -> sqlite3.Connection:
    """A connection with the ledger's PRAGMAs, in autocommit mode (we BEGIN ourselves)."""
    conn = sqlite_driver.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(f"PRAGMA journal_mode = {chosen_journal_mode()}")
    return conn


def prepare(conn: sqlite3.Connection, sources: int = 1000) -> None:
    """Source rows the floor's reservations point at (a migrated database is expected)."""
    now = now_ms()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT OR IGNORE INTO sources (id, state, in_queue, created_ms, last_checked_ms,"
        " failures, output_failures, backoff_steps, correction_used, archived_calls,"
        " archived_time_ms) VALUES (?, 'queued', 0, ?, ?, 0, 0, 0, 0, 0, 0)",
        [(f"floor-{i}", now, now) for i in range(sources)],
    )
    conn.execute("COMMIT")


def floor_cycle(conn: sqlite3.Connection, i: int, sources: int = 1000) -> None:
    """One durable reserve (count the rolling hour, insert) and one durable settle."""
    now = now_ms()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "SELECT count(*) FROM reservations WHERE created_ms > ?", (now - HOUR_MS,)
    ).fetchone()
    cur = conn.execute(
        _INSERT, (f"floor-{i % sources}", "alpha/m0", "alpha", now, now + 120_000, 2000, 9000, 9000)
    )
    rid = cur.lastrowid
    conn.execute("COMMIT")
    later = now_ms()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(_SETTLE, (later, later - now, 500, 200, 900, 900, rid))
    conn.execute("COMMIT")


def floor_per_cycle(conn: sqlite3.Connection, start: int, count: int) -> float:
    """Mean seconds per floor cycle."""
    t0 = time.perf_counter()
    for i in range(start, start + count):
        floor_cycle(conn, i)
    return (time.perf_counter() - t0) / count
