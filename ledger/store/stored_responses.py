"""Stored responses (R-FMT-2): which provider and model answered a Responses request whose
answer that provider keeps (`store` true or omitted), so that a later `previous_response_id`
request is pinned to it.

Only metadata is written (the response id, provider, model key and time), never a body. Rows
older than KEEP_MS (30 days) are deleted as new ones arrive, in the same transaction, so the
table holds at most 30 days of ids.
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from ledger.budgets.checks import HOUR_MS
from ledger.store.engine import Database
from ledger.store.schema import stored_responses

KEEP_MS = 30 * 24 * HOUR_MS
MAX_ID = 200
"""The longest response id recorded (a longer one is never pinned: the route's own provider)."""

_SR = stored_responses.c
_PRUNE = delete(stored_responses).where(_SR.created_ms < bindparam("b_before"))
_PROVIDER = select(_SR.provider, _SR.created_ms).where(_SR.response_id == bindparam("b_id"))


def _upsert(dialect: str) -> object:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(stored_responses).values(
        response_id=bindparam("b_id"),
        provider=bindparam("b_provider"),
        model=bindparam("b_model"),
        created_ms=bindparam("b_now"),
    )
    return statement.on_conflict_do_update(
        index_elements=[_SR.response_id],
        set_={"provider": statement.excluded.provider, "model": statement.excluded.model,
              "created_ms": statement.excluded.created_ms},
    )  # fmt: skip


_UPSERT = {name: _upsert(name) for name in ("sqlite", "postgresql")}


def remember(conn: Connection, now: int, response_id: str, provider: str, model: str) -> None:
    """Record who answered `response_id` (inside the caller's write transaction) and drop the
    rows past KEEP_MS."""
    if 0 < len(response_id) <= MAX_ID:
        params = {"b_id": response_id, "b_provider": provider, "b_model": model, "b_now": now}
        conn.execute(_UPSERT[conn.dialect.name], params)  # type: ignore[call-overload]
    conn.execute(_PRUNE, {"b_before": now - KEEP_MS})


def provider_of(db: Database, response_id: str, now: int) -> str | None:
    """The provider recorded for `response_id` within KEEP_MS, None when the ledger has none."""
    if not 0 < len(response_id) <= MAX_ID:
        return None
    with db.engine.connect() as conn:
        row = conn.execute(_PROVIDER, {"b_id": response_id}).first()
    if row is None or row.created_ms < now - KEEP_MS:
        return None
    return str(row.provider)
