"""Retention (R-DB-6): fold old settled attempts into per-day aggregates and carried counters.

Invariants:
- Only reservations that are settled or expired AND created before the cut-off are folded; the
  cut-off is at least 24 h (the longest live window) before the ledger time, so nothing a budget
  window still counts is ever touched. A reservation whose usage went above its estimate is
  kept until its settle time is before the cut-off as well (that usage counts at its settle
  time, R-TOK-3).
- Folding preserves every budget: each source's `archived_calls` / `archived_time_ms` grow by
  exactly what the deleted rows contributed to its live counters (R-RES-6, R-RES-8), its
  `source_models` rows are kept (R-RES-7), and `daily_totals` gains exactly the folded rows.
- Each batch is one write transaction (BEGIN IMMEDIATE, R-DB-2), so the lock is never held long.
- `cost_hours` is left as it is: folded rows are older than the window, so their hours are
  before the first hour the rolling 24 h cost reads from cost_hours and are never read again
  (they keep each hour's historic total, 24 small rows a day). The rolling hour's count
  (R-RES-1) reads `attempts` only from the hour after now - 1 h on, and its rows after now - 1 h:
  a row the cut-off folds (created more than 24 h before a ledger time that never goes back) is
  in neither, so that count stays exact too.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, bindparam, delete, insert, or_, select, update

from ledger.budgets.checks import DAY_MS
from ledger.errors import UsageError
from ledger.store import learned
from ledger.store.engine import Database
from ledger.store.pending import rehearsed
from ledger.store.reads import OPEN_LIKE
from ledger.store.reservations import expire_open
from ledger.store.schema import daily_totals, reservation_scopes, reservations, sources

LIVE_WINDOW_MS = DAY_MS
"""The longest window a budget still reads (the rolling 24 h cost ceiling)."""
DEFAULT_BATCH = 5_000
FOLDABLE = ("succeeded", "failed", "cancelled", "expired")
_STATUS_COLUMNS = {s: s for s in FOLDABLE}

_CANDIDATES = (
    select(
        reservations.c.id,
        reservations.c.source_id,
        reservations.c.model_key,
        reservations.c.status,
        reservations.c.created_ms,
        reservations.c.deadline_ms,
        reservations.c.duration_ms,
        reservations.c.input_tokens,
        reservations.c.output_tokens,
        reservations.c.cache_write_tokens,
        reservations.c.cache_read_tokens,
        reservations.c.cost_micro,
    )
    .where(
        reservations.c.created_ms < bindparam("cutoff"),
        reservations.c.status.in_(FOLDABLE),
        # R-TOK-3: usage above the estimate counts a day from its settle time, however old the
        # grant: such a row is kept until that day has passed too
        or_(reservations.c.overrun_ms.is_(None), reservations.c.overrun_ms < bindparam("cutoff")),
    )
    .order_by(reservations.c.created_ms, reservations.c.id)
    .limit(bindparam("batch"))
)
_CARRY = (
    update(sources)
    .where(sources.c.id == bindparam("b_id"))
    .values(
        archived_calls=sources.c.archived_calls + bindparam("b_calls"),
        archived_time_ms=sources.c.archived_time_ms + bindparam("b_time"),
    )
)
_ADD_TOTALS = (
    update(daily_totals)
    .where(daily_totals.c.day == bindparam("b_day"), daily_totals.c.model_key == bindparam("b_key"))
    .values(
        attempts=daily_totals.c.attempts + bindparam("b_attempts"),
        succeeded=daily_totals.c.succeeded + bindparam("b_succeeded"),
        failed=daily_totals.c.failed + bindparam("b_failed"),
        cancelled=daily_totals.c.cancelled + bindparam("b_cancelled"),
        expired=daily_totals.c.expired + bindparam("b_expired"),
        input_tokens=daily_totals.c.input_tokens + bindparam("b_input_tokens"),
        output_tokens=daily_totals.c.output_tokens + bindparam("b_output_tokens"),
        cache_write_tokens=daily_totals.c.cache_write_tokens + bindparam("b_cache_write_tokens"),
        cache_read_tokens=daily_totals.c.cache_read_tokens + bindparam("b_cache_read_tokens"),
        cost_micro=daily_totals.c.cost_micro + bindparam("b_cost_micro"),
        unknown_cost=daily_totals.c.unknown_cost + bindparam("b_unknown_cost"),
    )
)
_TOTAL_FIELDS = (
    "attempts",
    "succeeded",
    "failed",
    "cancelled",
    "expired",
    "input_tokens",
    "output_tokens",
    "cache_write_tokens",
    "cache_read_tokens",
    "cost_micro",
    "unknown_cost",
)


_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens")


@dataclass(frozen=True)
class CompactSummary:
    """What a compaction run folded."""

    folded: int
    batches: int
    cutoff_ms: int


def check_older_than(older_than_ms: int) -> int:
    """A cut-off age of at least 24 h (the longest live window), else UsageError."""
    if isinstance(older_than_ms, bool) or older_than_ms < LIVE_WINDOW_MS:
        raise UsageError("the compaction age must be at least 24h (the longest live window)")
    return older_than_ms


def utc_day(ms: int) -> str:
    """The UTC calendar day (YYYY-MM-DD) of a millisecond timestamp."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).date().isoformat()


def _time_used(status: str, created: int, deadline: int, duration: int | None) -> int:
    # exactly what reads.source_budget counts for the row (R-RES-8)
    if status in OPEN_LIKE:
        return int(deadline) - int(created)
    return int(duration or 0)


def fold_batch(conn: Connection, now: int, older_than_ms: int, batch: int) -> tuple[int, int]:
    """Fold up to `batch` rows inside the caller's write transaction: (rows folded, cut-off)."""
    cutoff = now - check_older_than(older_than_ms)
    expire_open(conn, now)  # open rows past their deadline are expired, as a reserve would do
    learned.prune(conn, now)  # readings past their reset (R-TOK-4), ignored since
    rows = conn.execute(_CANDIDATES, {"cutoff": cutoff, "batch": batch}).all()
    if not rows:
        return 0, cutoff
    carried: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    totals: dict[tuple[str, str], dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(_TOTAL_FIELDS, 0)
    )
    for r in rows:
        carry = carried[r.source_id]
        carry[0] += 1
        carry[1] += _time_used(r.status, r.created_ms, r.deadline_ms, r.duration_ms)
        t = totals[(utc_day(int(r.created_ms)), r.model_key)]
        t["attempts"] += 1
        t[_STATUS_COLUMNS[r.status]] += 1
        for name in _TOKEN_FIELDS:
            t[name] += int(getattr(r, name) or 0)
        if r.cost_micro is None:
            t["unknown_cost"] += 1
        else:
            t["cost_micro"] += int(r.cost_micro)
    conn.execute(
        _CARRY,
        [{"b_id": sid, "b_calls": c[0], "b_time": c[1]} for sid, c in carried.items()],
    )
    for (day, key), t in totals.items():
        params = {f"b_{name}": value for name, value in t.items()}
        updated = conn.execute(_ADD_TOTALS, {"b_day": day, "b_key": key, **params}).rowcount
        if not updated:
            conn.execute(insert(daily_totals).values(day=day, model_key=key, **t))
    ids = [int(r.id) for r in rows]
    for start in range(0, len(ids), 500):  # bounded IN lists
        chunk = ids[start : start + 500]
        # scope rows go with their reservations (a compacted row is far outside any scope window)
        owned = reservation_scopes.c.reservation_id.in_(chunk)
        conn.execute(delete(reservation_scopes).where(owned))
        conn.execute(delete(reservations).where(reservations.c.id.in_(chunk)))
    return len(rows), cutoff


@rehearsed
def compact_step(db: Database, now_ms: int, older_than_ms: int, batch: int = 1000) -> int:
    """One bounded write transaction of compaction (for the worker); returns rows folded.

    The cut-off is taken from the earlier of `now_ms` and the ledger time read after the lock,
    so a caller's stale clock can only make it more conservative.
    """
    check_older_than(older_than_ms)
    if batch <= 0:
        raise UsageError("the compaction batch must be positive")
    with db.write() as txn:
        folded, _ = fold_batch(txn.conn, min(now_ms, txn.now), older_than_ms, batch)
    return folded


@rehearsed
def compact(
    db: Database, now_ms: int, older_than_ms: int, batch: int = DEFAULT_BATCH
) -> CompactSummary:
    """Fold everything older than the cut-off, one bounded write transaction per batch."""
    check_older_than(older_than_ms)
    folded = batches = 0
    cutoff = now_ms - older_than_ms
    while True:
        with db.write() as txn:
            n, cutoff = fold_batch(txn.conn, min(now_ms, txn.now), older_than_ms, batch)
        if n == 0:
            break
        folded += n
        batches += 1
        if n < batch:
            break
    return CompactSummary(folded, batches, cutoff)
