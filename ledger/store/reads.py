"""Read queries shared by store operations (used inside their transactions; no writes here)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, Row, Select, bindparam, case, exists, func, select

from ledger.budgets.checks import DAY_MS, HOUR_MS, DailyWindow, SourceBudget
from ledger.kinds import CooldownScope, SourceState
from ledger.store import dialects, probes
from ledger.store.hot import Hot
from ledger.store.schema import cooldowns, cost_hours, reservations, source_models, sources

OPEN_LIKE = ("open", "expired")

# Statements are built once: executing a prebuilt statement skips construction and hits
# SQLAlchemy's compiled cache directly (the hot path runs them on every reserve).
_HOURLY_COUNT = (
    select(func.count())
    .select_from(reservations)
    .where(reservations.c.created_ms > bindparam("since"))
)
# The rolling 24 h cost (R-RES-2), exact, in one round trip: the window (since, now] is split at
# the first hour boundary after `since`. The partial first hour is summed row by row (covering
# index ix_reservations_created); every hour from the boundary on is summed from its cost_hours
# total, which the write transactions keep equal to the SUM of its rows. So at most one hour of
# reservations and about 24 bucket rows are read, however busy the ledger.
_PARTIAL_HOUR_COST = (
    select(func.coalesce(func.sum(reservations.c.cost_micro), 0))
    .where(
        reservations.c.created_ms > bindparam("since"),
        reservations.c.created_ms < bindparam("boundary"),
    )
    .scalar_subquery()
)
_FULL_HOURS_COST = (
    select(func.coalesce(func.sum(cost_hours.c.cost_micro), 0))
    .where(cost_hours.c.hour_start_ms >= bindparam("boundary"))
    .scalar_subquery()
)
_DAILY_COST = select(_PARTIAL_HOUR_COST, _FULL_HOURS_COST)
# Time used: settled durations plus the whole allowance of reservations still open (R-RES-8).
_TIME_USED = func.coalesce(
    func.sum(
        case(
            (
                reservations.c.status.in_(OPEN_LIKE),
                reservations.c.deadline_ms - reservations.c.created_ms,
            ),
            else_=func.coalesce(reservations.c.duration_ms, 0),
        )
    ),
    0,
)
# The source row and its live counters in one round trip.
_SOURCE_BUDGET = (
    select(
        sources.c.state,
        sources.c.retry_at_ms,
        sources.c.archived_calls,
        sources.c.archived_time_ms,
        func.count(reservations.c.id).label("calls"),
        _TIME_USED.label("used"),
    )
    .select_from(sources.outerjoin(reservations, reservations.c.source_id == sources.c.id))
    .where(sources.c.id == bindparam("source_id"))
    .group_by(
        sources.c.id,
        sources.c.state,
        sources.c.retry_at_ms,
        sources.c.archived_calls,
        sources.c.archived_time_ms,
    )
)
_SOURCE_MODELS = select(source_models.c.model_key).where(
    source_models.c.source_id == bindparam("source_id")
)
_HOT_SOURCE_BUDGET = Hot(_SOURCE_BUDGET)
_HOT_SOURCE_MODELS = Hot(_SOURCE_MODELS)
def _latest_cooldown(scope: Any, target: Any) -> Select[Any]:
    """The latest end of an active cooldown on a target (NULL when none): `scope` and `target`
    are values or bind parameters, `now` a bind parameter."""
    return select(func.max(cooldowns.c.until_ms)).where(
        cooldowns.c.scope == scope,
        cooldowns.c.target == target,
        cooldowns.c.until_ms > bindparam("now"),
    )


_COOLDOWN_UNTIL = _latest_cooldown(bindparam("scope"), bindparam("target"))


# What reserve reads of the shared state in one round trip: the rolling hour's count, the latest
# active cooldown end on the model's provider and on the model, and their recovery probes.
_SHARED_STATE = select(
    _HOURLY_COUNT.scalar_subquery(),
    _latest_cooldown(CooldownScope.PROVIDER.value, bindparam("provider")).scalar_subquery(),
    _latest_cooldown(CooldownScope.MODEL.value, bindparam("model_key")).scalar_subquery(),
    probes.probe_mark(CooldownScope.PROVIDER, "provider"),
    probes.probe_mark(CooldownScope.MODEL, "model_key"),
    exists()
    .where(reservations.c.status == "open", reservations.c.deadline_ms <= bindparam("now"))
    .label("overdue"),
)


@dataclass(frozen=True)
class SharedState:
    """The shared budgets, cooldowns and probes a reserve checks (R-RES-1, R-RES-5, R-POL-9)."""

    hourly: int
    hourly_next_free_ms: int | None
    provider_until: int | None
    model_until: int | None
    gate: probes.ProbeGate
    overdue: bool  # some open reservation is past its deadline (to be marked expired)


@cache
def _shared_with(also: Select[Any] | None) -> Hot:
    """The shared-state read with `also`'s columns after its own (one statement, one round trip)."""
    if also is None:
        return Hot(_SHARED_STATE)
    return Hot(select(*_SHARED_STATE.selected_columns, *also.selected_columns))


def shared_state(
    conn: Connection,
    now: int,
    calls_per_hour: int,
    provider: str,
    model_key: str,
    also: tuple[Select[Any], dict[str, Any]] | None = None,
) -> tuple[SharedState, tuple[Any, ...]]:
    """The rolling hour (and when its next slot frees, when full), the active cooldowns and the
    probes on a provider and a model, in one round trip (two when the hour is full); `also` (a
    cached select of scalar columns and its parameters, e.g. the reservation's scope use) is read
    in that same round trip and its values returned beside."""
    params = {"since": now - HOUR_MS, "now": now, "provider": provider, "model_key": model_key}
    statement = _shared_with(None if also is None else also[0])
    row = tuple(statement.first(conn, {**params, **({} if also is None else also[1])}))
    count, provider_until, model_until, provider_mark, model_mark, overdue = row[:6]
    next_free = None if count < calls_per_hour else _next_free(conn, now, count, calls_per_hour)
    shared = SharedState(
        int(count),
        next_free,
        None if provider_until is None else int(provider_until),
        None if model_until is None else int(model_until),
        probes.gate(provider, model_key, provider_mark, model_mark, now),
        bool(overdue),
    )
    return shared, row[6:]


def hourly_usage(conn: Connection, now: int, limit: int) -> tuple[int, int | None]:
    """Reservations created in the last 3600 s, and when the next slot frees when full."""
    count = conn.execute(_HOURLY_COUNT, {"since": now - HOUR_MS}).scalar_one()
    if count < limit:
        return count, None
    return count, _next_free(conn, now, count, limit)


def _next_free(conn: Connection, now: int, count: int, limit: int) -> int | None:
    """When the next slot of a full rolling hour frees (its oldest counted reservation ages out)."""
    oldest = conn.execute(
        select(reservations.c.created_ms)
        .where(reservations.c.created_ms > now - HOUR_MS)
        .order_by(reservations.c.created_ms)
        .limit(1)
        .offset(count - limit)
    ).scalar()
    return None if oldest is None else int(oldest) + HOUR_MS


def hour_start(ms: int) -> int:
    """The start of the UTC hour holding `ms` (the cost_hours key)."""
    return ms - ms % HOUR_MS


def daily_cost(conn: Connection, now: int) -> int:
    """Sum of cost (actual where known, else estimate) over the last 24 h.

    Exactly SUM(cost_micro) over the reservations created after now - 24 h (see _DAILY_COST).
    When a refusal needs to say when room frees, `daily_window` reads the rows themselves.
    """
    since = now - DAY_MS
    boundary = hour_start(since) + HOUR_MS
    partial, full = conn.execute(_DAILY_COST, {"since": since, "boundary": boundary}).one()
    return int(partial) + int(full)


_COST_LEAVING = (
    select(reservations.c.created_ms, reservations.c.cost_micro)
    .where(reservations.c.created_ms > bindparam("since"), reservations.c.cost_micro > 0)
    .order_by(reservations.c.created_ms, reservations.c.id)
)


def daily_window(
    conn: Connection, now: int, ceiling_micro: int, need_micro: int | None = None
) -> DailyWindow:
    """The rolling 24 h cost and when each part of it leaves the window (R-RES-2, R-SEL-10).

    With `need_micro` (the largest estimate the caller will ask about) the window's rows are read
    only when the spend leaves less room than that; otherwise the exact sum (`daily_cost`, one
    round trip) is all anyone needs, and a busy day's rows are not fetched on every selection.
    """
    if need_micro is not None:
        spent = daily_cost(conn, now)
        if spent + need_micro <= ceiling_micro:
            return DailyWindow(spent, ceiling_micro, (), room_for_micro=need_micro)
    leaving = tuple(
        (int(created) + DAY_MS, int(cost))
        for created, cost in conn.execute(_COST_LEAVING, {"since": now - DAY_MS})
    )
    # every costed row of the window is read here anyway: their sum is the spend
    return DailyWindow(sum(cost for _, cost in leaving), ceiling_micro, leaving)


def source_budget(conn: Connection, source_id: str) -> SourceBudget | None:
    """A source's state and counters (archived history included), or None if it does not exist."""
    row = _HOT_SOURCE_BUDGET.first(conn, {"source_id": source_id})
    if row is None:
        return None
    models = (m for (m,) in _HOT_SOURCE_MODELS.all(conn, {"source_id": source_id}))
    return SourceBudget(
        state=SourceState(row.state),
        retry_at_ms=row.retry_at_ms,
        calls=int(row.calls) + int(row.archived_calls),
        models=frozenset(models),
        time_used_ms=int(row.used) + int(row.archived_time_ms),
    )


def first_model(conn: Connection, source_id: str) -> str | None:
    """The first model a source used (its primary when the policy names no default)."""
    row = conn.execute(
        select(source_models.c.model_key)
        .where(source_models.c.source_id == source_id)
        .order_by(source_models.c.first_ms, source_models.c.model_key)
        .limit(1)
    ).scalar()
    return None if row is None else str(row)


def cooldown_until(conn: Connection, scope: CooldownScope, target: str, now: int) -> int | None:
    """The latest end of any active cooldown on this target (all origins)."""
    value = conn.execute(
        _COOLDOWN_UNTIL, {"scope": scope.value, "target": target, "now": now}
    ).scalar()
    return None if value is None else int(value)




_BY_ID = select(reservations).where(reservations.c.id == bindparam("b_id"))


def reservation_row(
    conn: Connection, reservation_id: int, query: Select[Any] = _BY_ID
) -> Row[Any] | None:
    """The reservation row with this id, or None; an id no row of this backend can have (past
    PostgreSQL's 32-bit or SQLite's 64-bit id column) is None too, never a database error."""
    if not dialects.can_be_row_id(conn, reservation_id):
        return None
    found: Row[Any] | None = _hot(query).first(conn, {"b_id": reservation_id})
    return found  # a row with the same attributes, `_mapping` and indexing as SQLAlchemy's


@cache
def _hot(query: Select[Any]) -> Hot:
    """A reservation read by id, run as a hot statement (one per query shape)."""
    return Hot(query)
