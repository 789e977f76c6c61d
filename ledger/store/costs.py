"""The cost a reservation counts (R-RES-2, R-SC-1): its hour totals and the actual cost of
reported usage. Every write of a reservation's cost_micro moves its creation hour's cost_hours
total (and its scopes') by the same amount in the same transaction, so the rolling 24 h cost read
from those totals stays exact."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    bindparam,
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


def cost_changed(conn: Connection, row: Row[Any], cost: int | None) -> None:
    """Settle replaced the stored cost (the estimate) with `cost`: move its hour total along."""
    delta = (cost or 0) - (row.cost_micro or 0)
    if delta:
        add_hour_cost(conn, int(row.created_ms), delta, 0)
        scopes.cost_changed(conn, int(row.id), int(row.created_ms), delta)  # R-SC-1


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
