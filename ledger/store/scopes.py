"""Scopes in the store (R-SC-1): the scopes a reservation is under, its rows, each scope's use.

A reserve's scope budgets are budgets of `ledger.budgets.unit` like every other: their use is read
in the reserving write transaction (ledger/store/usage.py) and, on a grant, `record` writes the
reservation's scope rows and hour totals in that same transaction, so a scope's budgets are exact
across processes, services and hosts, as the global ones are (R-DB-2). `uses_of` and
`status_uses` read every part of the scopes' use for status. No writes here but `record`,
`cost_changed` (called by settle) and `add_source_scopes`; `scopes_in_use` is the one read
transaction of its own (for `config validate`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, bindparam, func, insert, literal, select, update

from ledger.budgets.checks import DAY_MS, HOUR_MS
from ledger.budgets.scopes import ScopeUse
from ledger.config import Policy, ScopeLimits
from ledger.kinds import AttemptStatus
from ledger.store import reads
from ledger.store.engine import Database
from ledger.store.hot import Hot
from ledger.store.schema import (
    gateway_keys,
    reservation_scopes,
    reservations,
    scope_cost_hours,
    scope_token_minutes,
    scope_token_seconds,
    source_scopes,
)

_RS = reservation_scopes.c
_R = reservations.c

_SOURCE_SCOPES = select(source_scopes.c.scope).where(
    source_scopes.c.source_id == bindparam("source_id")
)
_INSERT_SOURCE_SCOPE = insert(source_scopes)

def _window_q(scope: str, rows: Any, total: Any, since: str, boundary: str) -> Any:
    """A scope's use over a rolling window, exact, as reads._DAILY_COST: `rows` (a select of one
    aggregate) over the scope's rows of the partial hour from `since` to `boundary`, plus `total`
    (a scope_cost_hours column) summed over every hour from `boundary` on (at most one hour of
    rows is read, however busy the scope)."""
    return (
        rows.where(
            _RS.scope == bindparam(scope),
            _RS.created_ms > bindparam(since),
            _RS.created_ms < bindparam(boundary),
        ).scalar_subquery()
        + select(func.coalesce(func.sum(total), 0))
        .where(
            scope_cost_hours.c.scope == bindparam(scope),
            scope_cost_hours.c.hour_start_ms >= bindparam(boundary),
        )
        .scalar_subquery()
    )


def _hourly_q(scope: str) -> Any:
    """The scope's reservations in the rolling hour (bind `scope` names the scope's parameter)."""
    rows = select(func.count()).select_from(reservation_scopes)
    return _window_q(scope, rows, scope_cost_hours.c.calls, "hour_since", "hour_boundary")


def _daily_q(scope: str) -> Any:
    """The scope's rolling 24 h cost (its reservations' cost: actual where settled, else the
    estimate)."""
    rows = select(func.coalesce(func.sum(_R.cost_micro), 0)).select_from(
        reservation_scopes.join(reservations, _R.id == _RS.reservation_id)
    )
    return _window_q(scope, rows, scope_cost_hours.c.cost_micro, "day_since", "boundary")


_SCH = scope_cost_hours.c
_INSERT_SCOPE_COST = insert(scope_cost_hours)
# a settle moves the hour totals of every scope its reservation is under
_SETTLED_COST = (
    update(scope_cost_hours)
    .where(
        _SCH.hour_start_ms == bindparam("b_hour"),
        _SCH.scope.in_(
            select(_RS.scope).where(_RS.reservation_id == bindparam("b_id")).scalar_subquery()
        ),
    )
    .values(
        cost_micro=_SCH.cost_micro + bindparam("b_cost"),
        input_tokens=_SCH.input_tokens + bindparam("b_in"),
        output_tokens=_SCH.output_tokens + bindparam("b_out"),
    )
)
_HOT_SETTLED_COST = Hot(_SETTLED_COST)


@cache
def _add_scopes_cost(count: int) -> Hot:
    """A grant's cost and one call added to `count` scopes' hour rows (binds `b_scope_I`): a
    fixed IN list per count, so the statement is compiled and prepared once, not per grant."""
    return Hot(
        update(scope_cost_hours)
        .where(_SCH.scope.in_(_scope_binds(count)), _SCH.hour_start_ms == bindparam("b_hour"))
        .values(
            cost_micro=_SCH.cost_micro + bindparam("b_cost"),
            calls=_SCH.calls + 1,
            input_tokens=_SCH.input_tokens + bindparam("b_in"),
            output_tokens=_SCH.output_tokens + bindparam("b_out"),
        )
    )


def _scope_binds(count: int) -> list[Any]:
    return [bindparam(f"b_scope_{i}") for i in range(count)]


_SCOPE_TOKENS = (
    (scope_token_seconds, "second_ms", 1000),
    (scope_token_minutes, "minute_ms", 60_000),
)
"""The scopes' token totals kept beside their hour totals: (table, time column, step)."""


@cache
def _add_scopes_tokens(level: int, count: int) -> Hot:
    """A grant's token estimate added to `count` scopes' rows of its second or minute (R-TOK-2,
    R-TOK-3; `level` indexes `_SCOPE_TOKENS`)."""
    table, time, _ = _SCOPE_TOKENS[level]
    c = table.c
    return Hot(
        update(table)
        .where(c.scope.in_(_scope_binds(count)), c[time] == bindparam("b_time"))
        .values(
            input_tokens=c.input_tokens + bindparam("b_in"),
            output_tokens=c.output_tokens + bindparam("b_out"),
        )
    )


@cache
def _insert_scope_rows(count: int) -> Hot:
    """A grant's `count` scope rows in one statement (binds `b_scope_I`)."""
    rows = [
        {"reservation_id": bindparam("b_id"), "scope": bind, "created_ms": bindparam("b_now")}
        for bind in _scope_binds(count)
    ]
    return Hot(insert(reservation_scopes).values(rows))


def _rows_of(level: int) -> tuple[Any, Any, Hot]:
    """A level's (which scopes have a row at `b_time`, its insert, a settle's move of the rows of
    every scope its reservation is under, when still kept)."""
    table, time, _ = _SCOPE_TOKENS[level]
    c = table.c
    have = select(c.scope).where(
        c.scope.in_(bindparam("b_scopes", expanding=True)), c[time] == bindparam("b_time")
    )
    settled = Hot(
        update(table)
        .where(
            c[time] == bindparam("b_time"),
            c.scope.in_(
                select(_RS.scope).where(_RS.reservation_id == bindparam("b_id")).scalar_subquery()
            ),
        )
        .values(
            input_tokens=c.input_tokens + bindparam("b_in"),
            output_tokens=c.output_tokens + bindparam("b_out"),
        )
    )
    return have, insert(table), settled


_TOKEN_ROWS = tuple(_rows_of(level) for level in range(len(_SCOPE_TOKENS)))


_HOUR_ROWS = select(_SCH.scope).where(
    _SCH.scope.in_(bindparam("b_scopes", expanding=True)), _SCH.hour_start_ms == bindparam("b_hour")
)


def _open_q(scope: str) -> tuple[Any, tuple[Any, ...]]:
    """Open and before its deadline: a settled or expired reservation frees its slot at once."""
    return (
        reservation_scopes.join(reservations, _R.id == _RS.reservation_id),
        (
            _RS.scope == bindparam(scope),
            _R.status == AttemptStatus.OPEN.value,
            _R.deadline_ms > bindparam("now"),
        ),
    )


def _in_flight_q(scope: str) -> Any:
    join, where = _open_q(scope)
    return select(func.count()).select_from(join).where(*where).scalar_subquery()


_OPEN = _open_q("scope")
_IN_FLIGHT_FREES = select(func.min(_R.deadline_ms)).select_from(_OPEN[0]).where(*_OPEN[1])
@cache
def _uses_statement(needs: tuple[tuple[bool, bool, bool], ...]) -> Select[Any]:
    """One round trip reading, for each scope in turn (bind `in_scope_I`), only what it limits:
    its hour's count, 24 h cost and calls in flight (an unlimited part is read as 0)."""
    parts: list[Any] = []
    for i, (hourly, daily, in_flight) in enumerate(needs):
        bind = f"in_scope_{i}"
        for j, (wanted, part) in enumerate(
            ((hourly, _hourly_q), (daily, _daily_q), (in_flight, _in_flight_q))
        ):
            column = part(bind) if wanted else literal(0)
            parts.append(column.label(f"u{i}_{j}"))
    return select(*parts)


def names_for(
    conn: Connection, policy: Policy, source_id: str, asked: Sequence[str], *, stored: bool = True
) -> list[str]:
    """The scopes a reservation is under: the caller's (checked before the transaction) and the
    source's own, sorted. A source scope the policy no longer defines is ignored: its limit was
    removed. With no scopes in the policy nothing is read; `stored=False` (a source not created
    yet, so none of its own) reads nothing either."""
    if not policy.scopes:
        return []
    own = conn.execute(_SOURCE_SCOPES, {"source_id": source_id}).scalars() if stored else ()
    return sorted({*asked, *(s for s in own if s in policy.scopes)})


def plan(
    now: int, scoped: Sequence[tuple[str, ScopeLimits]], *, everything: bool = False
) -> tuple[Select[Any], dict[str, Any]] | None:
    """The one read of several scopes' use at `now`: a cached select of scalar columns and its
    parameters (None for no scope), for `uses_from`; reserve reads it in the same round trip as
    the shared state (reads.shared_state), so a reserve under N scopes pays no extra statement."""
    if not scoped:
        return None
    window = {
        "hour_since": now - HOUR_MS,
        "hour_boundary": reads.hour_start(now - HOUR_MS) + HOUR_MS,
        "day_since": now - DAY_MS,
        "boundary": reads.hour_start(now - DAY_MS) + HOUR_MS,
        "now": now,
    }
    needs = tuple(
        (
            everything or limits.calls_per_hour is not None,
            everything or limits.daily_estimated_usd is not None,
            everything or limits.in_flight is not None,
        )
        for _, limits in scoped
    )
    binds = {f"in_scope_{i}": name for i, (name, _) in enumerate(scoped)}
    return _uses_statement(needs), {**window, **binds}


def uses_from(
    conn: Connection,
    now: int,
    scoped: Sequence[tuple[str, ScopeLimits]],
    values: Sequence[Any],
) -> list[ScopeUse]:
    """The scopes' use from the values `plan`'s read returned; a full part then reads when it
    frees, for that scope only."""
    out = []
    for i, (name, limits) in enumerate(scoped):
        count, cost, open_now = (int(v) for v in values[3 * i : 3 * i + 3])
        hourly, flight = limits.calls_per_hour, limits.in_flight
        next_free = None
        if hourly is not None and count >= hourly:
            next_free = _hour_frees_at(conn, now, name, count, hourly)
        flight_frees = None
        if flight is not None and open_now >= flight:
            window = {"now": now, "scope": name}
            flight_frees = conn.execute(_IN_FLIGHT_FREES, window).scalar()
        out.append(
            ScopeUse(
                name,
                count,
                next_free,
                cost,
                open_now,
                None if flight_frees is None else int(flight_frees),
            )
        )
    return out


def uses_of(
    conn: Connection,
    now: int,
    scoped: Sequence[tuple[str, ScopeLimits]],
    *,
    everything: bool = False,
) -> list[ScopeUse]:
    """Several scopes' use at `now` in one read (`plan`, then `uses_from`)."""
    read = plan(now, scoped, everything=everything)
    if read is None:
        return []
    return uses_from(conn, now, scoped, tuple(conn.execute(*read).one()))


def status_uses(conn: Connection, now: int, policy: Policy) -> list[ScopeUse]:
    """Every scope of the policy with all its use (R-SC-2), in name order, for status."""
    names = sorted(policy.scopes)
    return uses_of(conn, now, [(n, policy.scopes[n]) for n in names], everything=True)


def _hour_frees_at(conn: Connection, now: int, name: str, count: int, limit: int) -> int | None:
    """When the next slot of the scope's full rolling hour frees (its oldest counted row leaves)."""
    oldest = conn.execute(
        select(_RS.created_ms)
        .where(_RS.scope == name, _RS.created_ms > now - HOUR_MS)
        .order_by(_RS.created_ms)
        .limit(1)
        .offset(count - limit)
    ).scalar()
    return None if oldest is None else int(oldest) + HOUR_MS


def record(
    conn: Connection,
    reservation_id: int,
    names: Iterable[str],
    now: int,
    cost: int | None,
    tokens: tuple[int, int] = (0, 0),
) -> None:
    """The granted reservation's scope rows, and its cost, one call and its (input, output)
    token estimate in each scope's hour totals (and the tokens in its minute's and second's
    totals), in the reserving transaction."""
    scopes = list(names)
    if not scopes:
        return
    n = len(scopes)
    hour = reads.hour_start(now)
    params: dict[str, Any] = {f"b_scope_{i}": name for i, name in enumerate(scopes)}
    params.update(b_id=reservation_id, b_now=now, b_hour=hour)
    params.update(b_cost=cost or 0, b_in=tokens[0], b_out=tokens[1])
    _insert_scope_rows(n).rowcount(conn, params)
    if _add_scopes_cost(n).rowcount(conn, params) < n:  # a scope's first reservation this hour
        params["b_scopes"] = scopes
        have = set(conn.execute(_HOUR_ROWS, params).scalars())
        missing = [
            {
                "scope": s,
                "hour_start_ms": hour,
                "cost_micro": cost or 0,
                "calls": 1,
                "input_tokens": tokens[0],
                "output_tokens": tokens[1],
            }
            for s in scopes
            if s not in have
        ]
        conn.execute(_INSERT_SCOPE_COST, missing)
    for level, (_, time, step) in enumerate(_SCOPE_TOKENS):
        params["b_time"] = at = now - now % step
        if _add_scopes_tokens(level, n).rowcount(conn, params) < n:  # a scope's first
            have_q, insert_q, _ = _TOKEN_ROWS[level]
            params["b_scopes"] = scopes
            have = set(conn.execute(have_q, params).scalars())
            conn.execute(
                insert_q,
                [
                    {"scope": s, time: at, "input_tokens": tokens[0], "output_tokens": tokens[1]}
                    for s in scopes
                    if s not in have
                ],
            )


def cost_changed(
    conn: Connection,
    reservation_id: int,
    created_ms: int,
    delta: int,
    tokens: tuple[int, int] = (0, 0),
) -> None:
    """A settle replaced a reservation's cost and token usage: move its scopes' hour totals by
    `delta` and the (input, output) `tokens` (the caller's write transaction; a reservation under
    no scope changes no row)."""
    params = {
        "b_hour": reads.hour_start(created_ms), "b_id": reservation_id, "b_cost": delta,
        "b_in": tokens[0], "b_out": tokens[1],
    }  # fmt: skip
    # every scope of a grant has its hour row from the reserve on (never deleted): none moved
    # means the reservation is under no scope, and its second and minute rows are not looked for
    if _HOT_SETTLED_COST.rowcount(conn, params) and tokens != (0, 0):
        for (_, _, step), (_, _, settled) in zip(_SCOPE_TOKENS, _TOKEN_ROWS, strict=True):
            settled.rowcount(conn, {**params, "b_time": created_ms - created_ms % step})


def add_source_scopes(conn: Connection, source_id: str, names: Iterable[str]) -> None:
    """Put a source under more scopes (the ones it has stay), in the caller's transaction."""
    have = set(conn.execute(_SOURCE_SCOPES, {"source_id": source_id}).scalars())
    rows = [{"source_id": source_id, "scope": n} for n in sorted(set(names) - have)]
    if rows:
        conn.execute(_INSERT_SOURCE_SCOPE, rows)


def scopes_in_use(db: Database) -> set[str]:
    """Scope names something uses (`config validate`, R-SC-1): a source's, a key's that is not
    revoked, or a reservation's in the last 24 h (one read transaction)."""
    with db.read() as conn:
        now = db.read_now(conn)
        used = set(conn.execute(select(source_scopes.c.scope).distinct()).scalars())
        for text in conn.execute(
            select(gateway_keys.c.scopes).where(gateway_keys.c.revoked_ms.is_(None))
        ).scalars():
            used.update(str(text).split())
        used.update(
            conn.execute(
                select(_RS.scope).where(_RS.created_ms > now - DAY_MS).distinct()
            ).scalars()
        )
    return used
