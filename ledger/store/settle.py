"""Settle: one write transaction (R-DB-2) that records an outcome and applies the policy table
(ledger.policy_table.decide); a failure's part is ledger/store/failure.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    bindparam,
    delete,
    exists,
    select,
    update,
)

from ledger.budgets import checks as budgets
from ledger.catalog import Catalog, Model
from ledger.errors import NotFoundError, UsageError
from ledger.kinds import (
    AttemptRole,
    AttemptStatus,
    FailureKind,
    SourceState,
)
from ledger.policy_table import InteractivePace
from ledger.records import Cancelled, Failed, Outcome, SettleResult, Success
from ledger.store import health, learned, probes, reads
from ledger.store.costs import cost_changed, usage_columns, with_overrun
from ledger.store.failure import held_probes, settle_failure
from ledger.store.hot import Hot
from ledger.store.notices import record_notice
from ledger.store.pool_choice import settle_lease
from ledger.store.schema import (
    reservations,
    sources,
    transport_strikes,
)

# What settle reads: the row, whether it holds a probe, whether its model has transport strikes
# to clear on a success (each a statement an ordinary settle then skips).
_FOR_SETTLE = select(
    reservations,
    probes.HOLDS_A_PROBE.label("holds_probe"),
    exists()
    .where(transport_strikes.c.model_key == reservations.c.model_key)
    .label("has_strikes"),
).where(reservations.c.id == bindparam("b_id"))
_UPDATE_RESERVATION = update(reservations).where(reservations.c.id == bindparam("b_id"))
# the common success: the reported usage, its cost and the settle time (no subkind)
_HOT_SUCCEEDED = Hot(
    _UPDATE_RESERVATION,
    keys=(
        "status", "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens",
        "actual_micro", "cost_micro", "settled_ms", "duration_ms", "late", "overrun_ms",
    ),
)  # fmt: skip
_CLEAR_STRIKES = delete(transport_strikes).where(
    transport_strikes.c.model_key == bindparam("model_key")
)


def settle(
    conn: Connection,
    now: int,
    catalog: Catalog,
    reservation_id: int,
    outcome: Outcome,
    jitter: Callable[[], float],
    *,
    overran: bool = False,
    pace: InteractivePace | None = None,
) -> SettleResult:
    """Record an outcome and apply the policy table, inside the caller's write transaction.

    `pace`: the attempt belongs to a gateway request at interactive pace (R-GW-4).

    `overran`: the caller saw the deadline pass on its own clock (the call's elapsed time from
    the reservation, R-HTTP-3); the attempt is then `late` even if ledger time says otherwise.
    """
    row = reads.reservation_row(conn, reservation_id, _FOR_SETTLE)
    if row is None:
        raise NotFoundError("unknown reservation")
    if row.status not in reads.OPEN_LIKE:
        raise UsageError("this reservation is already settled")
    if outcome.limits is not None:  # R-TOK-4: what the answer said is left of its limits
        model_id = str(row.model_key).partition("/")[2]
        learned.record(conn, now, str(row.provider), model_id, outcome.limits)
    if isinstance(outcome, Failed) and outcome.classification.kind is FailureKind.CANCELLED:
        outcome = Cancelled()  # issue 12 item 9: a reported `cancelled` is the cancelled row
    late = now > row.deadline_ms or overran
    duration = max(0, now - row.created_ms)
    model = catalog.model(row.model_key)
    base = {"settled_ms": now, "duration_ms": duration, "late": late}
    if isinstance(outcome, Success):
        return _settle_success(conn, now, row, model, outcome, late, base)
    if isinstance(outcome, Cancelled):
        held = held_probes(conn, row)
        probe_actions = probes.settle_probes(
            conn, now, held, FailureKind.CANCELLED, (), claimed_ms=int(row.created_ms)
        )
        # usage seen before the cut (R-GW-7) is recorded; the cost moves only when it is complete
        usage = usage_columns(model, outcome) if outcome.usage_seen else {}
        actual = usage.get("actual_micro")
        if usage:
            usage = with_overrun(row, usage, now)
        cost = actual if actual is not None else row.cost_micro
        marked = {"subkind": "usage_estimated"} if outcome.usage_estimated else {}
        conn.execute(
            update(reservations)
            .where(reservations.c.id == reservation_id)
            .values(
                status=AttemptStatus.CANCELLED.value,
                kind=FailureKind.CANCELLED.value,
                **usage,
                **({"cost_micro": cost} if actual is not None else {}),
                **marked,
                **base,
            )
        )
        cost_changed(conn, row, cost, usage)
        return SettleResult(
            reservation_id,
            row.source_id,
            row.model_key,
            AttemptStatus.CANCELLED,
            late,
            kind=FailureKind.CANCELLED.value,
            subkind="cancelled",
            actions=("cancelled: no failure added; the reservation still counts", *probe_actions),
            cost_micro=cost,
        )
    return settle_failure(conn, now, row, model, outcome, late, base, jitter, pace)


def _settle_success(
    conn: Connection,
    now: int,
    row: Row[Any],
    model: Model | None,
    outcome: Success,
    late: bool,
    base: dict[str, object],
) -> SettleResult:
    r = row._mapping
    usage = with_overrun(row, usage_columns(model, outcome), now)
    actual = usage["actual_micro"]
    cost = actual if actual is not None else r["estimate_micro"]
    values = {
        "b_id": r["id"],
        "status": AttemptStatus.SUCCEEDED.value,
        **usage,
        "cost_micro": cost,
        **base,
    }
    if outcome.usage_estimated:
        conn.execute(_UPDATE_RESERVATION, {**values, "subkind": "usage_estimated"})
    else:
        _HOT_SUCCEEDED.rowcount(conn, values)
    cost_changed(conn, row, cost, usage)
    if not late:
        settle_lease(conn, now, row, success=True)
    actions: list[str] = []
    if r["has_strikes"]:
        conn.execute(_CLEAR_STRIKES, {"model_key": r["model_key"]})
    held = held_probes(conn, row)
    actions += probes.settle_probes(conn, now, held, None, (), claimed_ms=int(r["created_ms"]))
    health.record(conn, now, str(r["provider"]), str(r["model_key"]), None)
    if late:
        actions.append("late: usage recorded; the result must not be committed")
    if r["role"] == AttemptRole.FALLBACK.value and r["fallback_from"] and not late:
        # a late result is never used (R-RES-11): no notice may call the fallback a success
        pair = f"{r['fallback_from']} -> {r['model_key']}"
        record_notice(
            conn,
            now,
            "fallback",
            f"fallback:{pair}:{now // budgets.HOUR_MS}",
            f"fallback succeeded: {pair}",
            r["source_id"],
        )
        actions.append("fallback notice recorded")
    finished = False
    if outcome.finish and not late:
        conn.execute(
            update(sources)
            .where(sources.c.id == r["source_id"])
            .values(
                state=SourceState.DONE.value,
                finished_ms=now,
                lease_owner=None,
                lease_expires_ms=None,
            )
        )
        finished = True
        actions.append("source finished")
    return SettleResult(
        int(r["id"]),
        str(r["source_id"]),
        str(r["model_key"]),
        AttemptStatus.SUCCEEDED,
        late,
        actions=tuple(actions),
        finished=finished,
        cost_micro=cost,
    )
