"""Refusal counts (R-DIAG-1): how many requests a service refused, per minute, reason code, the
scope that refused and the gateway key that asked.

Invariant: counts arrive in batches (a service's in-memory tally, at most one batch a second), and
a batch is one UPSERT per distinct (minute, reason, scope, key) inside the caller's write
transaction, adding to the row's count; nothing here ever writes a row per refusal. Rows older
than KEEP_MS are deleted in the same transaction, so the table holds at most two hours of minutes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite

from ledger.budgets.checks import HOUR_MS
from ledger.store.schema import refusal_minutes

MINUTE_MS = 60_000
KEEP_MS = 2 * HOUR_MS
WINDOW_MS = HOUR_MS
"""Status shows the minutes that started within the last hour (the current one included)."""

_RM = refusal_minutes.c


@dataclass(frozen=True, order=True)
class RefusalKey:
    """What one count row is about: its minute, reason code, scope ('' none), key ('' none)."""

    minute_ms: int
    reason: str
    scope: str = ""
    key_name: str = ""


@dataclass(frozen=True)
class RefusalTotal:
    """Refusals of the last hour for one reason, scope and key, and the last minute they fell in."""

    reason: str
    scope: str
    key_name: str
    count: int
    last_minute_ms: int


def minute_of(now_ms: int) -> int:
    """The start of the minute `now_ms` falls in."""
    return now_ms - now_ms % MINUTE_MS


def _upsert(dialect: str) -> Any:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(refusal_minutes).values(
        minute_ms=bindparam("b_minute"),
        reason=bindparam("b_reason"),
        scope=bindparam("b_scope"),
        key_name=bindparam("b_key"),
        count=bindparam("b_count"),
    )
    return statement.on_conflict_do_update(
        index_elements=[_RM.minute_ms, _RM.reason, _RM.scope, _RM.key_name],
        set_={"count": _RM.count + statement.excluded.count},
    )


_UPSERT = {name: _upsert(name) for name in ("sqlite", "postgresql")}
_PRUNE = delete(refusal_minutes).where(_RM.minute_ms < bindparam("b_before"))


def add_counts(conn: Connection, now: int, counts: Mapping[RefusalKey, int]) -> None:
    """Add a batch of counts (one statement per row touched) and drop rows past KEEP_MS."""
    params = [
        {"b_minute": k.minute_ms, "b_reason": k.reason, "b_scope": k.scope, "b_key": k.key_name,
         "b_count": n}
        for k, n in sorted(counts.items())
        if n > 0
    ]  # fmt: skip
    if params:
        conn.execute(_UPSERT[conn.dialect.name], params)
    conn.execute(_PRUNE, {"b_before": minute_of(now) - KEEP_MS})


_LAST_HOUR = (
    select(
        _RM.reason,
        _RM.scope,
        _RM.key_name,
        func.sum(_RM.count).label("refused"),
        func.max(_RM.minute_ms).label("last_minute"),
    )
    .where(_RM.minute_ms > bindparam("b_since"))
    .group_by(_RM.reason, _RM.scope, _RM.key_name)
)


def last_hour(conn: Connection, now: int) -> list[RefusalTotal]:
    """The last hour's refusals by reason, scope and key, the most frequent first."""
    rows = conn.execute(_LAST_HOUR, {"b_since": minute_of(now) - WINDOW_MS}).all()
    totals = [
        RefusalTotal(str(r.reason), str(r.scope), str(r.key_name), int(r.refused),
                     int(r.last_minute))
        for r in rows
    ]  # fmt: skip
    return sorted(totals, key=lambda t: (-t.count, t.reason, t.scope, t.key_name))
