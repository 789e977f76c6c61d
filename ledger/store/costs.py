"""The cost and tokens a reservation counts (R-RES-2, R-SC-1, R-TOK-3): its hour totals and the
actual cost of reported usage. Every write of a reservation's cost_micro moves its creation hour's
cost_hours total (and its scopes') by the same amount in the same transaction, so the rolling 24 h
cost read from those totals stays exact; every write of its token usage moves its hour's
token_hours, token_minutes and token_seconds rows (and its scopes' token totals) the same way, so
a day's and a minute's token windows do too. Second rows are kept two minutes, minute rows 25
hours: the reserve that opens a row deletes the older ones."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    Table,
    bindparam,
    delete,
    insert,
    update,
)

from ledger.budgets import checks as budgets
from ledger.catalog import Model
from ledger.records import Cancelled, Failed, Success
from ledger.store import reads, scopes
from ledger.store.hot import Hot
from ledger.store.schema import (
    cost_hours,
    scope_token_minutes,
    scope_token_seconds,
    token_hours,
    token_minutes,
    token_seconds,
)

_ADD_HOUR_COST = (
    update(cost_hours)
    .where(cost_hours.c.hour_start_ms == bindparam("b_hour"))
    .values(
        cost_micro=cost_hours.c.cost_micro + bindparam("b_cost"),
        attempts=cost_hours.c.attempts + bindparam("b_attempts"),
    )
)
_INSERT_HOUR_COST = insert(cost_hours)
_HOT_ADD_HOUR_COST = Hot(_ADD_HOUR_COST)


def add_hour_cost(conn: Connection, created_ms: int, cost: int, attempts: int) -> None:
    """Add to the cost_hours total of the hour a reservation was created in (same transaction).

    Keeps cost_hours equal to SUM(cost_micro) / COUNT(*) of each hour's reservations (R-RES-2).
    """
    hour = reads.hour_start(created_ms)
    params = {"b_hour": hour, "b_cost": cost, "b_attempts": attempts}
    if _HOT_ADD_HOUR_COST.rowcount(conn, params) == 0:  # the hour's first reservation
        conn.execute(
            _INSERT_HOUR_COST, {"hour_start_ms": hour, "cost_micro": cost, "attempts": attempts}
        )


def _add_to_totals(totals: Table, time: str) -> Hot:
    """Add (input, output) tokens to a token totals row (binds `b_time`, `b_model`,
    `b_provider`, `b_in`, `b_out`)."""
    c = totals.c
    return Hot(
        update(totals)
        .where(
            c[time] == bindparam("b_time"),
            c.model_key == bindparam("b_model"),
            c.provider == bindparam("b_provider"),
        )
        .values(
            input_tokens=c.input_tokens + bindparam("b_in"),
            output_tokens=c.output_tokens + bindparam("b_out"),
        )
    )


_HOT_ADD_HOUR_TOKENS = _add_to_totals(token_hours, "hour_start_ms")
_HOT_INSERT_HOUR_TOKENS = Hot(insert(token_hours))
SECONDS_KEPT_MS = 120_000
"""How long second totals are kept: twice the longest window read from them (a minute's), so a
window never reaches a deleted row."""
MINUTES_KEPT_MS = 25 * 3_600_000
"""How long minute totals are kept: a day's window and its partial first hour."""


@dataclass(frozen=True)
class _Level:
    """Token totals kept for a while beside the hour totals: one row per `step` of time."""

    step: int
    kept_ms: int
    time: str
    add: Hot
    insert: Hot
    prune: tuple[Hot, Hot]  # the model rows and the scopes' older than `b_before`


def _level(totals: Table, scoped: Table, time: str, step: int, kept_ms: int) -> _Level:
    before: Any = bindparam("b_before")
    prune = (
        Hot(delete(totals).where(totals.c[time] < before)),
        Hot(delete(scoped).where(scoped.c[time] < before)),
    )
    return _Level(step, kept_ms, time, _add_to_totals(totals, time), Hot(insert(totals)), prune)


_LEVELS = (
    _level(token_seconds, scope_token_seconds, "second_ms", 1000, SECONDS_KEPT_MS),
    _level(token_minutes, scope_token_minutes, "minute_ms", 60_000, MINUTES_KEPT_MS),
)


def add_tokens(
    conn: Connection,
    created_ms: int,
    model_key: str,
    provider: str,
    tokens: tuple[int, int],
    *,
    granted: bool = True,
) -> None:
    """Add (input, output) tokens to the token_hours, token_minutes and token_seconds rows of the
    hour, minute and second a reservation was created in, its model and provider (same
    transaction): keeps each row equal to the token parts of those reservations (`token_parts`,
    R-TOK-3).

    A grant (`granted`) opens its second's (minute's) row when it is the first, and then deletes
    the second (minute) rows, the scopes' too, older than `SECONDS_KEPT_MS` (`MINUTES_KEPT_MS`).
    A settle only moves an existing row: a second or minute without one has been deleted, and no
    window reaches it."""
    hour = reads.hour_start(created_ms)
    params = {"b_model": model_key, "b_provider": provider, "b_in": tokens[0], "b_out": tokens[1]}
    row = {"model_key": model_key, "provider": provider, "input_tokens": tokens[0],
           "output_tokens": tokens[1]}  # fmt: skip
    if _HOT_ADD_HOUR_TOKENS.rowcount(conn, {**params, "b_time": hour}) == 0:  # the hour's first
        _HOT_INSERT_HOUR_TOKENS.rowcount(conn, {**row, "hour_start_ms": hour})
    for level in _LEVELS:
        at = created_ms - created_ms % level.step
        if level.add.rowcount(conn, {**params, "b_time": at}) == 0 and granted:  # its first
            level.insert.rowcount(conn, {**row, level.time: at})
            before = {"b_before": at - level.kept_ms}
            for prune in level.prune:
                prune.rowcount(conn, before)


def token_parts(get: Callable[[str], Any]) -> tuple[int, int]:
    """The (input, output) tokens a reservation counts in a token window (R-TOK-3): its usage
    once settled with usage (prompt-cache reads and writes on the input side: a provider's token
    limit counts them), else its estimate; `get` reads a column by name."""
    inp, out = get("input_tokens"), get("output_tokens")
    if inp is None:
        in_part = int(get("estimate_input_tokens") or 0)
    else:
        cached = int(get("cache_read_tokens") or 0) + int(get("cache_write_tokens") or 0)
        in_part = int(inp) + cached
    out_part = int(get("estimate_output_tokens") or 0) if out is None else int(out)
    return in_part, out_part


def with_overrun(row: Row[Any], usage: Mapping[str, Any], now: int) -> dict[str, Any]:
    """`usage` (the columns a settle writes) with `overrun_ms`: the settle time when the usage
    goes above the estimate on the input or the output side (R-TOK-3), else None."""
    r = row._mapping
    merged = {**r, **usage}
    in_part, out_part = token_parts(merged.get)
    over = in_part > int(r["estimate_input_tokens"] or 0) or out_part > int(
        r["estimate_output_tokens"] or 0
    )
    return {**usage, "overrun_ms": now if over else None}


def cost_changed(
    conn: Connection, row: Row[Any], cost: int | None, usage: Mapping[str, Any] | None = None
) -> None:
    """Settle replaced the stored cost (the estimate) with `cost` and wrote `usage`'s columns:
    move its hour totals of cost and tokens (and its scopes') along."""
    r = row._mapping
    created, rid = int(r["created_ms"]), int(r["id"])
    delta = (cost or 0) - (r["cost_micro"] or 0)
    if delta:
        add_hour_cost(conn, created, delta, 0)
    tokens = (0, 0)
    if usage:
        before = token_parts(r.get)
        after = token_parts({**r, **usage}.get)
        tokens = (after[0] - before[0], after[1] - before[1])
        if tokens != (0, 0):
            add_tokens(
                conn, created, str(r["model_key"]), str(r["provider"]), tokens, granted=False
            )
    if delta or tokens != (0, 0):
        scopes.cost_changed(conn, rid, created, delta, tokens)  # R-SC-1


def usage_columns(
    model: Model | None, outcome: Success | Failed | Cancelled
) -> dict[str, int | None]:
    """The reported usage columns and its actual cost (a reported USD cost wins), or None.

    Cache writes and reads are priced on top of the (uncached) input tokens; unreported ones are
    taken as none.
    """
    cost_usd = outcome.cost_usd if isinstance(outcome, Success) else None
    inp, out = outcome.input_tokens, outcome.output_tokens
    actual = None
    if cost_usd is not None:
        actual = budgets.usd_to_micro(cost_usd)
    elif model is not None and inp is not None and out is not None:
        cached = (outcome.cache_write_tokens or 0, outcome.cache_read_tokens or 0)
        actual = budgets.actual_micro(model, inp, out, *cached)
    return {
        "input_tokens": inp,
        "output_tokens": out,
        "cache_write_tokens": outcome.cache_write_tokens,
        "cache_read_tokens": outcome.cache_read_tokens,
        "actual_micro": actual,
    }
