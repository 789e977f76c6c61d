"""A reserve through a pool (R-RT-4..6): its strategy's order, its sticky lease, the first
candidate granted, all in the reserving write transaction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)

from ledger.budgets import checks as budgets
from ledger.config import Policy
from ledger.errors import UsageError
from ledger.kinds import (
    RefusalReason,
)
from ledger.records import Reservation
from ledger.routing import pools
from ledger.store.requests import BY_REQUEST_ID, PoolPlan, ReserveRequest, to_reservation
from ledger.store.schema import (
    pool_cursors,
    pool_sticky,
    reservations,
)

ReserveModel = Callable[
    [Connection, int, Policy, ReserveRequest, str], "Reservation | budgets.Refusal"
]
"""The reserve of one concrete model (reserve.reserve_model), handed in (it reserves through
this module in turn)."""

# Refusals that no other candidate of a pool escapes: the pool stops at the first of them.
_POOL_WIDE = frozenset(
    {
        RefusalReason.SHARED_HOURLY_BUDGET,
        RefusalReason.SOURCE_SETTLED,
        RefusalReason.SOURCE_PAUSED,
        RefusalReason.SOURCE_BACKOFF,
        RefusalReason.SOURCE_CALLS,
        RefusalReason.SOURCE_TIME,
    }
)
_CURSOR = select(pool_cursors.c.position).where(pool_cursors.c.pool == bindparam("b_pool"))
_MOVE_CURSOR = (
    update(pool_cursors)
    .where(pool_cursors.c.pool == bindparam("b_pool"))
    .values(position=bindparam("b_position"), updated_ms=bindparam("b_now"))
)
_INSERT_CURSOR = insert(pool_cursors)
_LEASE = select(pool_sticky).where(
    pool_sticky.c.pool == bindparam("b_pool"), pool_sticky.c.scope == bindparam("b_scope")
)
_DROP_LEASE = delete(pool_sticky).where(
    pool_sticky.c.pool == bindparam("b_pool"), pool_sticky.c.scope == bindparam("b_scope")
)
_KEEP_LEASE = (
    update(pool_sticky)
    .where(
        pool_sticky.c.pool == bindparam("b_pool"),
        pool_sticky.c.scope == bindparam("b_scope"),
        pool_sticky.c.model_key == bindparam("b_model"),
    )
    .values(success_ms=bindparam("b_now"))
)
_INSERT_LEASE = insert(pool_sticky)


def _hour_usage(conn: Connection, now: int, keys: list[str]) -> dict[str, int]:
    """Reservations per model in the rolling hour (`least-used`)."""
    rows = conn.execute(
        select(reservations.c.model_key, func.count())
        .where(
            reservations.c.model_key.in_(keys),
            reservations.c.created_ms > now - budgets.HOUR_MS,
        )
        .group_by(reservations.c.model_key)
    ).all()
    return {str(k): int(n) for k, n in rows}


def reserve_pool(
    conn: Connection,
    now: int,
    policy: Policy,
    request: ReserveRequest,
    plan: PoolPlan,
    policy_fp: str,
    reserve_model: ReserveModel,
) -> Reservation | budgets.Refusal:
    """The pool's choice and the reservation, in the caller's write transaction (R-RT-5);
    `reserve_model` reserves each concrete candidate tried."""
    if request.request_id is not None:
        ids = {"b_namespace": request.namespace, "request_id": request.request_id}
        row = conn.execute(BY_REQUEST_ID, ids).first()
        if row is not None:
            if row.source_id != request.source_id or row.pool != plan.pool:
                raise UsageError("this request id was already used for another source or model")
            return to_reservation(row, replayed=True)
    spec = policy.pools[plan.pool]
    scope = None
    if spec.sticky != "off":
        scope = request.source_id if spec.sticky_scope == "source" else ""
    refusals: list[budgets.Refusal] = []
    errors: list[UsageError] = []
    base = replace(request, pool=None, via_pool=plan.pool, sticky_scope=scope)
    chosen = _choose(
        conn, now, policy, base, plan, plan.pool, plan.effort, policy_fp, refusals, errors,
        reserve_model,
    )
    if chosen is not None:
        return chosen
    if refusals:
        times = [r.retry_at_ms for r in refusals if r.retry_at_ms is not None]
        return budgets.Refusal(refusals[0].reason, min(times) if times else None)
    if errors:
        raise errors[0]
    return budgets.Refusal(RefusalReason.NO_POOL_CANDIDATE)


def _choose(
    conn: Connection,
    now: int,
    policy: Policy,
    request: ReserveRequest,
    plan: PoolPlan,
    name: str,
    effort: str | None,
    policy_fp: str,
    refusals: list[budgets.Refusal],
    errors: list[UsageError],
    reserve_model: ReserveModel,
    sticky_key: str | None = None,
) -> Reservation | budgets.Refusal | None:
    """Try one pool's candidates in its strategy's order; the first grant wins (a nested pool is
    tried by its own strategy). A pool-wide refusal ends the search at once; None: no grant.

    `sticky_key`: the concrete model the reserved pool's live sticky lease holds (R-RT-6); at
    every level the candidate leading to it (the model, or the nested pool holding it) goes first.
    """
    spec = policy.pools[name]
    cands = pools.candidates(policy, name)
    cursor = None
    if spec.strategy == "round-robin":
        cursor = conn.execute(_CURSOR, {"b_pool": name}).scalar()
    usage = None
    if spec.strategy == "least-used":
        usage = _hour_usage(conn, now, [c.key for c in cands if not c.is_pool])
    seed = pools.random_seed(request.source_id, now, len(refusals))
    order = pools.try_order(spec.strategy, cands, pools.PoolState(cursor, seed, usage))
    if name == plan.pool and request.sticky_scope is not None:
        lease = conn.execute(_LEASE, {"b_pool": name, "b_scope": request.sticky_scope}).first()
        ttl = plan.cache_ttl_ms.get(str(lease.model_key), 0) if lease is not None else 0
        if lease is not None and pools.holds(
            spec.sticky, int(lease.chosen_ms), lease.success_ms, ttl, now
        ):
            sticky_key = str(lease.model_key)  # (an expired one: the next success replaces it)
    if sticky_key is not None:
        held = sticky_key
        order.sort(key=lambda c: not pools.leads_to(policy, c, held))  # the sticky pick first
    for cand in order:
        result: Reservation | budgets.Refusal | None
        if cand.is_pool:
            result = _choose(
                conn, now, policy, request, plan, cand.key.removeprefix("pool/"),
                cand.effort or effort, policy_fp, refusals, errors, reserve_model, sticky_key,
            )
        else:
            model = plan.models.get(cand.key)
            if model is None or cand.key == request.fallback_from:
                continue  # not callable for this request, or the model that just failed
            concrete = replace(request, model=model, effort=cand.effort or effort)
            try:
                result = reserve_model(conn, now, policy, concrete, policy_fp)
            except UsageError as exc:  # e.g. a follow-up this candidate cannot be
                errors.append(exc)
                continue
            if isinstance(result, budgets.Refusal):
                refusals.append(result)
                if sticky_key is not None and sticky_key == cand.key:
                    # a cooling or otherwise refused sticky pick releases its lease (R-RT-6)
                    drop = {"b_pool": plan.pool, "b_scope": request.sticky_scope}
                    conn.execute(_DROP_LEASE, drop)
                    sticky_key = None
                if result.reason in _POOL_WIDE:
                    return result
                continue
        if isinstance(result, Reservation):
            if spec.strategy == "round-robin":
                moved = {"b_pool": name, "b_position": cand.index, "b_now": now}
                if conn.execute(_MOVE_CURSOR, moved).rowcount == 0:
                    conn.execute(
                        _INSERT_CURSOR, {"pool": name, "position": cand.index, "updated_ms": now}
                    )
            return result
        if result is not None:  # a pool-wide refusal from a nested pool
            return result
    return None


def settle_lease(conn: Connection, now: int, row: Row[Any], success: bool) -> None:
    """Keep the sticky lease of a pool reservation (R-RT-6): a success makes its candidate the
    lease (keeping when it was first chosen when it already was), a failure releases it."""
    r = row._mapping
    if r["pool"] is None or r["sticky_scope"] is None:
        return
    key = {"b_pool": r["pool"], "b_scope": r["sticky_scope"]}
    if not success:
        lease = conn.execute(_LEASE, key).first()
        if lease is not None and lease.model_key == r["model_key"]:
            conn.execute(_DROP_LEASE, key)
        return
    if conn.execute(_KEEP_LEASE, {**key, "b_model": r["model_key"], "b_now": now}).rowcount:
        return
    conn.execute(_DROP_LEASE, key)
    conn.execute(
        _INSERT_LEASE,
        {
            "pool": r["pool"],
            "scope": r["sticky_scope"],
            "model_key": r["model_key"],
            "chosen_ms": int(r["created_ms"]),
            "success_ms": now,
        },
    )
