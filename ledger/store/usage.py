"""The budgets' use, read in the reserving write transaction (issue 43, R-DB-2).

One generic read per (window, measure, dimension) of `ledger.budgets.unit`: `plan` puts a scalar
column per usage key a reserve needs into one statement (reserve reads it in the same round trip
as the shared state, `reads.shared_state`), and `leaving` reads, for a refusal only, when the
refused budget's window frees. A rolling hour or 24 h of the whole ledger or of a scope sums its
partial first hour row by row and every later hour from its hour totals (cost_hours,
scope_cost_hours, kept equal to the rows by every write), so at most an hour of rows is read
however busy the ledger; a day's token window of a model, provider, glob or scope reads at most
a minute of rows (the whole minutes of its first hour from minute totals, later hours from hour
totals), and a minute's its partial first second row by row plus every later second from its
second totals (token_seconds, scope_token_seconds); every other
rolling window counts its rows (covering index on created_ms). A token window's usage above
estimates is read from the small index of overruns. Two usages come from reads of their own: the
shared rolling hour's count (with the cooldowns, `reads.shared_state`) and a source's lifetime
counters (`reads.source_budget`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, and_, bindparam, case, func, literal, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import Boolean, String

from ledger.budgets.unit import Budget, Dimension, Measure, UsageKey, Use, Window
from ledger.clock import DAY_MS, HOUR_MS, MINUTE_MS, SECOND_MS
from ledger.kinds import AttemptStatus
from ledger.store.schema import (
    cost_hours,
    reservation_scopes,
    reservations,
    scope_cost_hours,
    scope_token_minutes,
    scope_token_seconds,
    token_hours,
    token_minutes,
    token_seconds,
)

_R = reservations.c
_RS = reservation_scopes.c
_SCH = scope_cost_hours.c


class _GlobMatch(ColumnElement[bool]):
    """`model_key GLOB :p` on SQLite, `model_key LIKE :p ESCAPE '\\'` on PostgreSQL: the
    parameter is the glob already turned into that dialect's pattern (`glob_pattern`)."""

    inherit_cache = True
    type = Boolean()
    _traverse_internals = [  # noqa: RUF012
        ("pattern", InternalTraversal.dp_clauseelement),
        ("column", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, pattern: Any, column: Any = None) -> None:
        self.pattern = pattern
        self.column = _R.model_key if column is None else column


class _UnindexedGlobMatch(_GlobMatch):
    """The same match on a `model_key` no index serves (`_Unindexed`)."""

    inherit_cache = True


def _model_key_sql(element: _GlobMatch, compiler: Any, sqlite: bool, **kw: Any) -> str:
    column = compiler.process(element.column, **kw)
    if not isinstance(element, _UnindexedGlobMatch):
        return str(column)
    return f"+{column}" if sqlite else f"({column} || '')"


@compiles(_GlobMatch, "sqlite")
def _glob_sqlite(element: _GlobMatch, compiler: Any, **kw: Any) -> str:
    column = _model_key_sql(element, compiler, True, **kw)
    return f"({column} GLOB {compiler.process(element.pattern, **kw)})"


@compiles(_GlobMatch)
def _glob_like(element: _GlobMatch, compiler: Any, **kw: Any) -> str:
    column = _model_key_sql(element, compiler, False, **kw)
    return f"({column} LIKE {compiler.process(element.pattern, **kw)} ESCAPE '\\')"


class _Unindexed(ColumnElement[Any]):
    """A column's value that no index serves, so that a planner takes the one index left (with
    or without statistics): `+col` on SQLite (its documented no-op that disqualifies a term);
    elsewhere `(col || '')` for text and a number as it is (PostgreSQL already prefers the
    settle time's two-sided range, and filters a number inside that index)."""

    inherit_cache = True
    _traverse_internals = [("element", InternalTraversal.dp_clauseelement)]  # noqa: RUF012

    def __init__(self, element: Any) -> None:
        self.element = element
        self.type = element.type


@compiles(_Unindexed, "sqlite")
def _unindexed_sqlite(element: _Unindexed, compiler: Any, **kw: Any) -> str:
    return f"+{compiler.process(element.element, **kw)}"


@compiles(_Unindexed)
def _unindexed_other(element: _Unindexed, compiler: Any, **kw: Any) -> str:
    column = compiler.process(element.element, **kw)
    return f"({column} || '')" if isinstance(element.type, String) else str(column)


SHAPE = tuple[Window, Measure, Dimension]
"""A usage key without its target: what decides the query."""


def _count() -> Any:
    return func.count()


def _cost() -> Any:
    return func.sum(_R.cost_micro)


def _input_part() -> Any:
    """A row's input tokens: its usage once settled with usage (prompt-cache reads and writes
    included: a provider's token limit counts them), else its estimate (R-TOK-3)."""
    cached = func.coalesce(_R.cache_read_tokens, 0) + func.coalesce(_R.cache_write_tokens, 0)
    return case(
        (_R.input_tokens.is_(None), _R.estimate_input_tokens), else_=_R.input_tokens + cached
    )


def _output_part() -> Any:
    return func.coalesce(_R.output_tokens, _R.estimate_output_tokens)


def _both_parts() -> Any:
    return _input_part() + _output_part()


def _input_estimate() -> Any:
    return _R.estimate_input_tokens


def _output_estimate() -> Any:
    return _R.estimate_output_tokens


def _both_estimates() -> Any:
    return _R.estimate_input_tokens + _R.estimate_output_tokens


_TOKEN_PARTS: dict[Measure, Callable[[], Any]] = {
    Measure.TOKENS: _both_parts,
    Measure.INPUT_TOKENS: _input_part,
    Measure.OUTPUT_TOKENS: _output_part,
}
_ESTIMATES: dict[Measure, Callable[[], Any]] = {
    Measure.TOKENS: _both_estimates,
    Measure.INPUT_TOKENS: _input_estimate,
    Measure.OUTPUT_TOKENS: _output_estimate,
}


def _summed(part: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: func.sum(part())


_BY_ROW: dict[Measure, Callable[[], Any]] = {
    Measure.CALLS: _count,
    Measure.COST: _cost,
    **{m: _summed(part) for m, part in _TOKEN_PARTS.items()},
}
"""What a row adds to a measure."""


def glob_pattern(dialect: str, glob: str) -> str:
    """A model-key glob (`*` any run, `?` one character, all else literal) as the backend's
    pattern: SQLite's GLOB (a `[` made literal) or PostgreSQL's LIKE (escaped with `\\`)."""
    if dialect == "sqlite":
        return glob.replace("[", "[[]")
    escaped = glob.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


def _glob_match(pattern: Any) -> Any:
    """`model_key` against a pattern bound per dialect (`glob_pattern`)."""
    return _GlobMatch(pattern if isinstance(pattern, ColumnElement) else literal(pattern))


def _dim_filter(dim: Dimension, target: Any) -> Any:
    """The reservations a dimension's target holds (a scope's: joined through its rows)."""
    if dim is Dimension.GLOB:
        return _glob_match(target)
    column = _DIM_COLUMNS.get(dim, _RS.scope if dim is Dimension.SCOPE else None)
    return None if column is None else column == target


_DIM_COLUMNS = {
    Dimension.SOURCE: _R.source_id,
    Dimension.PROVIDER: _R.provider,
    Dimension.MODEL: _R.model_key,
}


def _rows(dim: Dimension, *columns: Any) -> Select[Any]:
    """A select over the reservations (joined to their scope rows for a scope)."""
    if dim is Dimension.SCOPE:
        joined = reservation_scopes.join(reservations, _R.id == _RS.reservation_id)
        return select(*columns).select_from(joined)
    return select(*columns).select_from(reservations)


def _created(dim: Dimension) -> Any:
    """The creation time a window is over (a scope row's own for a scope)."""
    return _RS.created_ms if dim is Dimension.SCOPE else _R.created_ms


def _where(dim: Dimension, target: Any, *more: Any) -> Any:
    found = _dim_filter(dim, target)
    return and_(*more) if found is None else and_(found, *more)


_TH = token_hours.c
_TS = token_seconds.c
_STS = scope_token_seconds.c
_TM = token_minutes.c
_STM = scope_token_minutes.c
_BUCKET_TOKENS: dict[Measure, Callable[[Any], Any]] = {
    Measure.TOKENS: lambda c: c.input_tokens + c.output_tokens,
    Measure.INPUT_TOKENS: lambda c: c.input_tokens,
    Measure.OUTPUT_TOKENS: lambda c: c.output_tokens,
}
"""A token measure's part of a totals row (token_hours, scope_cost_hours, token_seconds,
scope_token_seconds)."""


def _bucket_target(dim: Dimension, columns: Any, target: Any) -> Any:
    """The totals rows of a model, provider, glob or scope."""
    if dim is Dimension.GLOB:
        return _GlobMatch(target, columns.model_key)
    if dim is Dimension.SCOPE:
        return columns.scope == target
    return (columns.model_key if dim is Dimension.MODEL else columns.provider) == target


_TOKEN_BUCKETS: dict[Window, tuple[Any, Any, str]] = {
    Window.ROLLING_DAY: (_TH, _SCH, "hour_start_ms"),
    Window.ROLLING_MINUTE: (_TS, _STS, "second_ms"),
}
"""A token window's totals: (per model and provider, per scope, their time column)."""
_DAY_MINUTES = (_TM, _STM, "minute_ms")
"""A day's token window reads the whole minutes of its partial first hour from these."""
_TOKEN_DIMS = (Dimension.MODEL, Dimension.PROVIDER, Dimension.GLOB, Dimension.SCOPE)


def bucket_ms(window: Window) -> int:
    """How long one totals row of `window`'s reads covers: a second for a minute's token window
    (token_seconds), an hour for every other (cost_hours, token_hours, scope_cost_hours)."""
    return SECOND_MS if window is Window.ROLLING_MINUTE else HOUR_MS


def _token_buckets(window: Window, measure: Measure, dim: Dimension, i: int) -> Any | None:
    """R-TOK-2, R-TOK-3: a minute's or a day's token window of a model, provider, glob or scope.

    A minute's: its partial first second of grants row by row plus every later second from the
    second totals (token_seconds, scope_token_seconds). A day's: its partial first minute row by
    row, the whole minutes of its partial first hour from the minute totals (token_minutes,
    scope_token_minutes) and every later hour from the hour totals (token_hours,
    scope_cost_hours). Every write keeps the totals equal to the rows' token parts; the overrun
    part as for any token window. None when no totals hold it."""
    if dim not in _TOKEN_DIMS or window not in _TOKEN_BUCKETS:
        return None
    target: Any = bindparam(f"u{i}_target")
    since: Any = bindparam(f"u{i}_since")
    boundary: Any = bindparam(f"u{i}_boundary")
    fine: Any = bindparam(f"u{i}_fine") if window is Window.ROLLING_DAY else boundary
    counted = func.coalesce(_BY_ROW[measure](), 0)
    partial = _rows(dim, counted).where(
        _where(dim, target, _created(dim) > since, _created(dim) < fine)
    )
    total = partial.scalar_subquery() + _totals(_TOKEN_BUCKETS[window], measure, dim, target,
                                                boundary)  # fmt: skip
    if window is Window.ROLLING_DAY:  # the whole minutes of the partial first hour
        total = total + _totals(_DAY_MINUTES, measure, dim, target, fine, boundary)
    return total + _overrun(dim, measure, target, since)


def _totals(
    level: tuple[Any, Any, str], measure: Measure, dim: Dimension, target: Any, start: Any,
    end: Any = None,
) -> Any:
    """The sum of a target's totals rows from `start` on (and before `end`)."""
    models, scoped, time = level
    columns = scoped if dim is Dimension.SCOPE else models
    when = [getattr(columns, time) >= start]
    if end is not None:
        when.append(getattr(columns, time) < end)
    summed = select(func.coalesce(func.sum(_BUCKET_TOKENS[measure](columns)), 0))
    return summed.where(*when, _bucket_target(dim, columns, target)).scalar_subquery()


def _bucketed(shape: SHAPE, i: int) -> Any | None:
    """The rolling hour's count or 24 h cost of the ledger or a scope, or a day's token window,
    from its hour totals plus the partial first hour's rows (exactly the rows' SUM); None when
    no hour totals hold it."""
    window, measure, dim = shape
    if measure in _TOKEN_PARTS:
        return _token_buckets(window, measure, dim, i)
    if window not in (Window.ROLLING_HOUR, Window.ROLLING_DAY) or dim not in (
        Dimension.GLOBAL,
        Dimension.SCOPE,
    ):
        return None
    if dim is Dimension.GLOBAL and measure is Measure.COST:
        total, buckets = cost_hours.c.cost_micro, cost_hours
    elif dim is Dimension.SCOPE and measure in (Measure.CALLS, Measure.COST):
        total = _SCH.calls if measure is Measure.CALLS else _SCH.cost_micro
        buckets = scope_cost_hours
    else:
        return None
    target: Any = bindparam(f"u{i}_target")
    since: Any = bindparam(f"u{i}_since")
    boundary: Any = bindparam(f"u{i}_boundary")
    partial = _rows(dim, func.coalesce(_BY_ROW[measure](), 0)).where(
        _where(dim, target, _created(dim) > since, _created(dim) < boundary)
    )
    hours = [buckets.c.hour_start_ms >= boundary]
    if dim is Dimension.SCOPE:
        hours.append(_SCH.scope == target)
    full = select(func.coalesce(func.sum(total), 0)).where(*hours)
    return partial.scalar_subquery() + full.scalar_subquery()


def _column(shape: SHAPE, i: int) -> Any:
    """The scalar column reading usage `shape` for the target bound as `u{i}_target`."""
    window, measure, dim = shape
    bucketed = _bucketed(shape, i)
    if bucketed is not None:
        return bucketed
    target: Any = bindparam(f"u{i}_target")
    if window is Window.IN_FLIGHT and measure is Measure.CALLS:
        open_now = (_R.status == AttemptStatus.OPEN.value, _R.deadline_ms > bindparam("u_now"))
        return _rows(dim, func.count()).where(_where(dim, target, *open_now)).scalar_subquery()
    if window.length_ms is not None and measure in _BY_ROW:
        since = _created(dim) > bindparam(f"u{i}_since")
        counted = func.coalesce(_BY_ROW[measure](), 0)
        granted = _rows(dim, counted).where(_where(dim, target, since)).scalar_subquery()
        if measure not in _TOKEN_PARTS:
            return granted
        return granted + _overrun(dim, measure, target, bindparam(f"u{i}_since"))
    raise ValueError(f"no stored usage for {measure} over {window} per {dim}")


def _excess(measure: Measure) -> Any:
    """Usage above the estimate (0 when within it or unsettled)."""
    over = _TOKEN_PARTS[measure]() - _ESTIMATES[measure]()
    return case((over > 0, over), else_=0)


OVERRUN_INDEX = "ix_reservations_overrun"
"""(overrun_ms, created_ms) of only the rows whose usage went above the estimate (revision 0015):
a token window's usage above the estimates counted at its settle time (R-TOK-3)."""


def _settled_since(dim: Dimension, target: Any, since: Any, now: Any, *columns: Any) -> Select[Any]:
    """The rows of `target` granted in the day before `since` whose usage went above their
    estimate and that settled after it, read from the partial index of such rows
    (OVERRUN_INDEX): however busy the ledger, only overruns settled in the window are looked at.
    The target's and the grant time's terms are `_Unindexed`, so that no planner (statistics or
    not) prefers the target's index and a day of its grants. Every time is the ledger's (never
    ahead of `now`), so a row settled after `since` was settled by `now`: the two-sided range
    shows a planner how few rows that is (and implies the index's `overrun_ms IS NOT NULL`). A
    scope's rows are the ones whose scope row (its primary key) names it."""
    found: Any = None
    if dim is Dimension.SCOPE:
        on = and_(_RS.reservation_id == _R.id, _RS.scope == target)
        query = select(*columns).select_from(reservations.join(reservation_scopes, on))
    else:
        query = select(*columns).select_from(reservations)
        if dim is Dimension.GLOB:
            pattern = target if isinstance(target, ColumnElement) else literal(target)
            found = _UnindexedGlobMatch(pattern)
        elif (column := _DIM_COLUMNS.get(dim)) is not None:
            found = _Unindexed(column) == target
    created = _Unindexed(_R.created_ms)
    window = (
        _R.overrun_ms > since, _R.overrun_ms <= now, created > since - DAY_MS, created <= since
    )  # fmt: skip
    return query.where(*window) if found is None else query.where(found, *window)


def _overrun(dim: Dimension, measure: Measure, target: Any, since: Any) -> Any:
    """R-TOK-3: the excess of usage over the estimate also counts at the settle time, so an
    overrun settled after its grant left the window still delays the next grants. Rows granted
    up to a day before the window are looked at (a reservation settles within its deadline,
    expiry or not, long before that), found by their settle time (`_settled_since`)."""
    total = func.coalesce(func.sum(_excess(measure)), 0)
    return _settled_since(dim, target, since, bindparam("u_now"), total).scalar_subquery()


@cache
def _statement(shapes: tuple[SHAPE, ...]) -> Select[Any]:
    """One select of a column per usage shape (cached per list: compiled and prepared once)."""
    return select(*(_column(shape, i).label(f"u{i}") for i, shape in enumerate(shapes)))


def read_here(budget: Budget) -> bool:
    """Whether `plan` reads this budget's use (the shared hour and a source's counters have
    reads of their own)."""
    window, measure, dim = budget.window, budget.measure, budget.applies_to.dimension
    if window is Window.LIFETIME:
        return False
    return (window, measure, dim) != (Window.ROLLING_HOUR, Measure.CALLS, Dimension.GLOBAL)


def plan(
    now: int, keys: Sequence[UsageKey], dialect: str = "sqlite"
) -> tuple[Select[Any], dict[str, Any]] | None:
    """The one read of every usage in `keys` at `now`: a cached select of scalar columns (in the
    order of `keys`) and its parameters; None for none."""
    if not keys:
        return None
    params: dict[str, Any] = {"u_now": now}
    for i, (window, _, dim, target) in enumerate(keys):
        params[f"u{i}_target"] = glob_pattern(dialect, target) if dim is Dimension.GLOB else target
        if window.length_ms is not None:
            since = now - window.length_ms
            params[f"u{i}_since"] = since
            step = bucket_ms(window)
            params[f"u{i}_boundary"] = since - since % step + step
            if window is Window.ROLLING_DAY:  # a day's token window: its first whole minute
                params[f"u{i}_fine"] = since - since % MINUTE_MS + MINUTE_MS
    return _statement(tuple(k[:3] for k in keys)), params


def uses(keys: Sequence[UsageKey], values: Sequence[Any]) -> dict[UsageKey, Use]:
    """The uses `plan`'s read returned, by key."""
    return {k: Use(int(v)) for k, v in zip(keys, values, strict=True)}


def leaving(
    conn: Connection, now: int, budget: Budget, usage_key: UsageKey, use: Use, amount: int
) -> Use:
    """`use` with when its parts leave the window, for a refusal's retry time: a count's the one
    time its excess has left by (the oldest counted row past the limit leaves), a cost's every
    costed row (their sum is then the use), in flight the earliest deadline of the open ones."""
    window, measure, dim, target = usage_key
    if dim is Dimension.GLOB:
        target = glob_pattern(conn.dialect.name, target)
    excess = use.used + amount - budget.limit
    if window is Window.IN_FLIGHT:
        first = _rows(dim, func.min(_R.deadline_ms)).where(
            _where(dim, target, _R.status == AttemptStatus.OPEN.value, _R.deadline_ms > now)
        )
        at = conn.execute(first).scalar()
        return Use(use.used, () if at is None else ((int(at), excess),))
    length = window.length_ms
    if length is None or excess <= 0:
        return Use(use.used, ())
    created = _created(dim)
    since = created > now - length
    if measure in _TOKEN_PARTS:
        return _tokens_leaving(conn, now, length, measure, dim, target, use)
    if measure is Measure.COST:
        ids = _RS.reservation_id if dim is Dimension.SCOPE else _R.id
        rows = conn.execute(
            _rows(dim, created, _R.cost_micro)
            .where(_where(dim, target, since, _R.cost_micro > 0))
            .order_by(created, ids)
        )
        parts = tuple((int(at) + length, int(cost)) for at, cost in rows)
        return Use(sum(cost for _, cost in parts), parts)
    oldest = conn.execute(
        _rows(dim, created)
        .where(_where(dim, target, since))
        .order_by(created)
        .limit(1)
        .offset(excess - 1)
    ).scalar()
    return Use(use.used, () if oldest is None else ((int(oldest) + length, excess),))


def _tokens_leaving(
    conn: Connection,
    now: int,
    length: int,
    measure: Measure,
    dim: Dimension,
    target: Any,
    use: Use,
) -> Use:
    """Every part of a token window with when it leaves (R-TOK-3): a grant counts its usage
    (else its estimate) while its grant time is in the window; the usage above the estimate
    then stays until its settle time has left too. Never both at once: the provider counted
    those tokens once."""
    created = _created(dim)
    since = now - length
    columns = (_R.created_ms, _R.settled_ms, _TOKEN_PARTS[measure](), _excess(measure))
    granted = _rows(dim, *columns).where(_where(dim, target, created > since))
    settled_in = _settled_since(dim, target, since, now, *columns)
    parts: list[tuple[int, int]] = []
    for query in (granted, settled_in):
        for at, settled, counted, excess in conn.execute(query):
            over = int(excess or 0)
            if int(at) > since:
                parts.append((int(at) + length, int(counted or 0) - over))
            if over and settled is not None:
                parts.append((max(int(settled), int(at)) + length, over))
    return Use(use.used, tuple(sorted(p for p in parts if p[1] > 0)))


def first_leaving(conn: Connection, now: int, usage_key: UsageKey) -> int | None:
    """When the first part of a token window's use leaves it (status, R-TOK-5): the oldest grant
    in the window, or the earliest settle time of an overrun still counted (R-TOK-3); None when
    the window holds nothing. Two indexed minimums, never the window's rows."""
    window, measure, dim, target = usage_key
    length = window.length_ms
    if length is None or measure not in _TOKEN_PARTS:
        return None
    if dim is Dimension.GLOB:
        target = glob_pattern(conn.dialect.name, target)
    created = _created(dim)
    since = now - length
    granted = _rows(dim, func.min(created)).where(_where(dim, target, created > since))
    over = _settled_since(dim, target, since, now, func.min(_R.overrun_ms)).where(
        _excess(measure) > 0
    )
    first = conn.execute(select(granted.scalar_subquery(), over.scalar_subquery())).one()
    times = [int(at) + length for at in first if at is not None]
    return min(times) if times else None


def hour_use(count: int, next_free_ms: int | None, limit: int) -> Use:
    """The shared rolling hour's use as `reads.shared_state` read it: when it is full for
    callsPerHour (`limit`) it read when its oldest counted reservation past the limit leaves."""
    if count < limit:
        return Use(count)
    return Use(count, () if next_free_ms is None else ((next_free_ms, count + 1 - limit),))


def from_source(source: str, calls: int, models: int, time_used_ms: int) -> Mapping[UsageKey, Use]:
    """A source's lifetime counters (`reads.source_budget`, archived history included)."""
    return {
        (Window.LIFETIME, Measure.CALLS, Dimension.SOURCE, source): Use(calls),
        (Window.LIFETIME, Measure.MODELS, Dimension.SOURCE, source): Use(models),
        (Window.LIFETIME, Measure.TIME, Dimension.SOURCE, source): Use(time_used_ms),
    }
