"""Learned limits in the ledger (R-TOK-4): written by a settle, read by a reserve and selection.

`record` keeps, in the settle's write transaction, what an answer's headers reported left of its
provider's token limits per (provider, upstream model id) and kind; a newer reading replaces an
older one, and readings past their reset are ignored (deleted by retention, `prune`). `plan` adds
to the reserve's one read of the shared state (`reads.shared_state`) what is left of each kind for
the reserved model: the reported remaining minus the estimates of the reservations on it granted
after the reading (NULL: no live reading), so every process subtracts every other's grants and
16 processes cannot each spend the same remainder. `live` is the same for every live reading, for
selection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, and_, bindparam, case, delete, func, literal, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from ledger.budgets import learned as learned_check
from ledger.budgets.checks import Refusal
from ledger.learned import HORIZON_MS, LearnedLimits, LimitKind
from ledger.store.hot import Hot
from ledger.store.schema import learned_limits, reservations

_L = learned_limits.c
_R = reservations.c

_ESTIMATES = {
    LimitKind.TOKENS: _R.estimate_input_tokens + _R.estimate_output_tokens,
    LimitKind.INPUT_TOKENS: _R.estimate_input_tokens,
    LimitKind.OUTPUT_TOKENS: _R.estimate_output_tokens,
}
_PRUNE = delete(learned_limits).where(_L.reset_ms <= bindparam("b_now"))


def prune(conn: Connection, now: int) -> None:
    """Delete the readings past their reset (ignored since; a newer one of the same key replaces
    its row anyway): done by retention's transactions, not on every settle."""
    conn.execute(_PRUNE, {"b_now": now})


def _granted_since(kind: LimitKind, model_key: Any) -> Any:
    """The estimates of `kind` granted on a model after its reading (correlated to the row)."""
    granted = select(func.coalesce(func.sum(_ESTIMATES[kind]), 0)).where(
        _R.model_key == model_key, _R.created_ms > _L.read_at_ms
    )
    return granted.scalar_subquery()


def _left(kind: LimitKind) -> Any:
    """What is left of `kind` for the model bound as `l_provider`, `l_model`, `l_key` at `l_now`:
    NULL when it has no live reading."""
    row = select(_L.remaining - _granted_since(kind, bindparam("l_key"))).where(
        _L.provider == bindparam("l_provider"),
        _L.model_id == bindparam("l_model"),
        _L.kind == kind.value,
        _L.reset_ms > bindparam("l_now"),
    )
    return row.scalar_subquery().label(f"l_{kind.value}")


_COLUMNS = tuple(_left(kind) for kind in LimitKind)


@cache
def _with_columns(also: Select[Any] | None) -> Select[Any]:
    """`also`'s columns, then what is left of each kind (one statement, built once per `also`)."""
    return select(*(() if also is None else also.selected_columns), *_COLUMNS)


def plan(
    also: tuple[Select[Any], dict[str, Any]] | None, now: int, provider: str, model_id: str
) -> tuple[Select[Any], dict[str, Any]]:
    """`also` (a reserve's usage read, `usage.plan`) with what is left of each kind of the
    model's learned limits after it: read in the reserve's one round trip."""
    params = {"l_provider": provider, "l_model": model_id, "l_key": f"{provider}/{model_id}",
              "l_now": now}  # fmt: skip
    if also is None:
        return _with_columns(None), params
    return _with_columns(also[0]), {**also[1], **params}


def split(values: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[LimitKind, int]]:
    """The values `plan`'s read returned: the usage read's, and what is left per kind with a
    live reading."""
    n = len(LimitKind)
    left = {kind: int(v) for kind, v in zip(LimitKind, values[-n:], strict=True) if v is not None}
    return values[:-n], left


_RESET = select(_L.reset_ms).where(
    _L.provider == bindparam("l_provider"),
    _L.model_id == bindparam("l_model"),
    _L.kind == bindparam("l_kind"),
)


def reset_of(conn: Connection, provider: str, model_id: str, kind: LimitKind) -> int | None:
    """When a reading resets (for a refusal's retry time; read for a refusal only)."""
    params = {"l_provider": provider, "l_model": model_id, "l_kind": kind.value}
    found = conn.execute(_RESET, params).scalar()
    return None if found is None else int(found)


CONCURRENT_MS = 250
"""Answers read within this long of each other may have been decided by the provider in either
order (they travel and are settled concurrently): of those the lower remaining is kept, never an
earlier-decided higher one that happened to arrive last; a reading clearly newer replaces any."""


def _upsert(dialect: str) -> Any:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(learned_limits)
    new = statement.excluded
    concurrent = new.read_at_ms > _L.read_at_ms - CONCURRENT_MS
    return statement.on_conflict_do_update(
        index_elements=[_L.provider, _L.model_id, _L.kind],
        set_={"remaining": new.remaining, "limit_tokens": new.limit_tokens,
              "read_at_ms": new.read_at_ms, "reset_ms": new.reset_ms},
        where=or_(
            new.read_at_ms >= _L.read_at_ms + CONCURRENT_MS,  # clearly newer: it replaces
            and_(concurrent, new.remaining < _L.remaining),  # answers in flight together
            and_(concurrent, new.remaining == _L.remaining, _L.read_at_ms <= new.read_at_ms),
        ),
    )  # fmt: skip



_ROW_KEYS = ("provider", "model_id", "kind", "remaining", "limit_tokens", "read_at_ms", "reset_ms")
_UPSERT = {name: Hot(_upsert(name), keys=_ROW_KEYS) for name in ("sqlite", "postgresql")}


def record(
    conn: Connection, now: int, provider: str, model_id: str, limits: LearnedLimits
) -> None:
    """Keep an answer's readings (inside the settle's write transaction). A reading is never
    taken as read after `now`, and one whose reset is not in (now, now + HORIZON_MS] is not
    kept (a caller's clock far off must not hold a model)."""
    read_at = min(limits.read_at_ms, now)
    rows = [
        {"provider": provider, "model_id": model_id, "kind": one.kind.value,
         "remaining": one.remaining, "limit_tokens": one.limit, "read_at_ms": read_at,
         "reset_ms": one.reset_at_ms}
        for one in limits.limits
        if now < one.reset_at_ms <= now + HORIZON_MS
    ]  # fmt: skip
    upsert = _UPSERT[conn.dialect.name]
    for row in rows:  # one to three: a hot statement each (a settle's cost, R-TOK-4)
        upsert.rowcount(conn, row)


@dataclass(frozen=True)
class LiveLimit:
    """One live reading with what is left of it now (selection, status)."""

    provider: str
    model_id: str
    kind: LimitKind
    left: int
    remaining: int
    limit: int | None
    read_at_ms: int
    reset_ms: int

    @property
    def model_key(self) -> str:
        """`provider/model-id`."""
        return f"{self.provider}/{self.model_id}"


def _live_statement() -> Select[Any]:
    key = _L.provider + literal("/") + _L.model_id
    granted = case(*[(_L.kind == k.value, _granted_since(k, key)) for k in LimitKind], else_=0)
    return (
        select(_L.provider, _L.model_id, _L.kind, _L.remaining - granted, _L.remaining,
               _L.limit_tokens, _L.read_at_ms, _L.reset_ms)
        .where(_L.reset_ms > bindparam("l_now"))
        .order_by(_L.provider, _L.model_id, _L.kind)
    )  # fmt: skip


_LIVE = _live_statement()
_KINDS: Mapping[str, LimitKind] = {k.value: k for k in LimitKind}


def live(conn: Connection, now: int) -> tuple[LiveLimit, ...]:
    """Every live reading and what is left of it at `now` (one statement; the table holds a
    row per model and kind recently answered)."""
    rows = conn.execute(_LIVE, {"l_now": now})
    return tuple(
        LiveLimit(str(p), str(m), _KINDS[k], int(left), int(rem),
                  None if lim is None else int(lim), int(at), int(reset))
        for p, m, k, left, rem, lim, at, reset in rows
        if k in _KINDS
    )  # fmt: skip


def refused(
    conn: Connection, left: Mapping[LimitKind, int], amounts: Mapping[Any, int | None],
    provider: str, model_id: str,
) -> Refusal | None:
    """The reserve's check (R-TOK-4): `provider_tokens_exhausted` until the reading's reset when
    the estimate does not fit what is left (`split`), else None."""
    kind = learned_check.exhausted(left, amounts)
    if kind is None:
        return None
    reset = reset_of(conn, provider, model_id, kind)
    return learned_check.refusal(kind, left[kind], f"{provider}/{model_id}", reset)
