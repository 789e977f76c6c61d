"""Reserve and settle: each is exactly one write transaction (R-DB-2) that reads, decides, writes.

The decisions themselves are pure (ledger.admission.check, ledger.policy_table.decide); this module
only reads the state they need and writes what they return. Every write of a reservation's
cost_micro moves its creation hour's cost_hours total by the same amount in the same transaction,
so the rolling 24 h cost read from those totals stays exact (R-RES-2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    RowMapping,
    Select,
    bindparam,
    delete,
    exists,
    func,
    insert,
    select,
    update,
)

from ledger import admission
from ledger.budgets import checks as budgets
from ledger.catalog import Catalog, Model
from ledger.config import Policy
from ledger.errors import NotFoundError, SourceScopeMismatch, UsageError
from ledger.kinds import (
    AttemptRole,
    AttemptStatus,
    CooldownScope,
    FailureKind,
    FollowUp,
    RefusalReason,
    SourceState,
)
from ledger.policy_table import Decision, FailureContext, InteractivePace, decide
from ledger.records import Cancelled, Failed, Outcome, Reservation, SettleResult, Success
from ledger.routing import pools
from ledger.routing.chains import primary_key
from ledger.store import dialects, health, probes, reads, scopes
from ledger.store.cooldowns import upsert_cooldown
from ledger.store.notices import record_notice, record_pause
from ledger.store.schema import (
    cost_hours,
    pool_cursors,
    pool_sticky,
    reservations,
    source_models,
    source_scopes,
    sources,
    transport_strikes,
)

STRIKE_WINDOW_MS = 15 * 60_000
FOLLOW_UP_GRACE_MS = 10_000
"""How long after the failed reservation's deadline its immediate follow-up may still be
reserved (a settle and a reserve of the same queue item, each maybe waiting for the write lock)."""

DEFAULT_NAMESPACE = ""
"""The request ids of the socket, the service token, /v1, the CLI and the library (R-SC-3a)."""

# Hot-path statements, built once (construction and cache-key work is most of the Python cost).
_BY_REQUEST_ID = select(reservations).where(
    reservations.c.namespace == bindparam("b_namespace"),
    reservations.c.request_id == bindparam("request_id"),
)
# R-SC-3a: a source and its scopes, one row per scope (one with NULL: a source under none; no
# row: a source new to the ledger)
_SOURCE_AND_SCOPES = (
    select(source_scopes.c.scope)
    .select_from(sources.outerjoin(source_scopes, source_scopes.c.source_id == sources.c.id))
    .where(sources.c.id == bindparam("b_id"))
)
_INSERT_SOURCE_SCOPE = insert(source_scopes)
_BY_ID = select(reservations).where(reservations.c.id == bindparam("b_id"))
# What settle reads: the row, whether it holds a probe, whether its model has transport strikes
# to clear on a success (each a statement an ordinary settle then skips).
_FOR_SETTLE = select(
    reservations,
    probes.HOLDS_A_PROBE.label("holds_probe"),
    exists()
    .where(transport_strikes.c.model_key == reservations.c.model_key)
    .label("has_strikes"),
).where(reservations.c.id == bindparam("b_id"))
_INSERT_SOURCE = insert(sources)
_INSERT_RESERVATION = insert(reservations)
_INSERT_SOURCE_MODEL = insert(source_models)
_TOUCH_SOURCE = (
    update(sources)
    .where(sources.c.id == bindparam("b_id"))
    .values(last_checked_ms=bindparam("b_now"))
)
_EXPIRE_OPEN = (
    update(reservations)
    .where(
        reservations.c.status == AttemptStatus.OPEN.value,
        reservations.c.deadline_ms <= bindparam("b_now"),
    )
    .values(status=AttemptStatus.EXPIRED.value)
)
_UPDATE_RESERVATION = update(reservations).where(reservations.c.id == bindparam("b_id"))
_CLEAR_STRIKES = delete(transport_strikes).where(
    transport_strikes.c.model_key == bindparam("model_key")
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


@dataclass(frozen=True)
class ReserveRequest:
    """One request for call authority."""

    source_id: str
    model: Model
    input_bytes: int
    request_id: str | None = None
    override: bool = False
    role: AttemptRole = AttemptRole.PRIMARY
    fallback_from: str | None = None
    # the failed reservation this immediate follow-up (fallback or correction) comes after
    immediate_after: int | None = None
    # the source must exist already (`source evolve`: an override of a known source, never a
    # new source made by a mistyped id)
    existing: bool = False
    effort: str | None = None  # the route's reasoning effort, recorded with the reservation
    # through a pool (R-RT-4): the reserve picks the concrete candidate (`model` is then only
    # the pool's first candidate, never used for the grant)
    pool: PoolPlan | None = None
    via_pool: str | None = None  # set on the concrete request a pool choice makes
    sticky_scope: str | None = None
    # the scopes the caller puts this reservation under (R-SC-1; the source's own are added)
    scopes: tuple[str, ...] = ()
    # the gateway key that sent it (R-SC-3a; `scopes` are then the key's): its request ids are
    # its own namespace, and it may name only a source wholly inside its scopes, or a new one
    gateway_key: str | None = None

    @property
    def namespace(self) -> str:
        """Where the request id is unique: each gateway key's own, else the default one."""
        return DEFAULT_NAMESPACE if self.gateway_key is None else f"key:{self.gateway_key}"


@dataclass(frozen=True)
class PoolPlan:
    """A reserve through `pool/NAME`: the pool's name, its route's effort (a candidate's own
    wins) and the concrete candidates that can be called at all (available, with text, allowed by
    the route rules, fitting the request), with their prompt-cache lifetimes (R-RT-6)."""

    pool: str
    models: Mapping[str, Model]
    effort: str | None = None
    cache_ttl_ms: Mapping[str, int] = field(default_factory=dict)


def insert_source(
    conn: Connection,
    source_id: str,
    now: int,
    *,
    in_queue: bool = False,
    payload_ref: str | None = None,
) -> None:
    """Create a source the caller found missing, in the caller's write transaction."""
    conn.execute(
        _INSERT_SOURCE,
        {
            "id": source_id,
            "state": SourceState.QUEUED.value,
            "in_queue": in_queue,
            "payload_ref": payload_ref,
            "created_ms": now,
            "last_checked_ms": now,
        },
    )


def expire_open(conn: Connection, now: int) -> None:
    """Reservations past their deadline and never settled become `expired` (and keep counting)."""
    conn.execute(_EXPIRE_OPEN, {"b_now": now})


def add_hour_cost(conn: Connection, created_ms: int, cost: int, attempts: int) -> None:
    """Add to the cost_hours total of the hour a reservation was created in (same transaction).

    Keeps cost_hours equal to SUM(cost_micro) / COUNT(*) of each hour's reservations (R-RES-2).
    """
    hour = reads.hour_start(created_ms)
    params = {"b_hour": hour, "b_cost": cost, "b_attempts": attempts}
    if conn.execute(_ADD_HOUR_COST, params).rowcount == 0:  # the hour's first reservation
        conn.execute(
            _INSERT_HOUR_COST, {"hour_start_ms": hour, "cost_micro": cost, "attempts": attempts}
        )


def _cost_changed(conn: Connection, row: Row[Any], cost: int | None) -> None:
    """Settle replaced the stored cost (the estimate) with `cost`: move its hour total along."""
    delta = (cost or 0) - (row.cost_micro or 0)
    if delta:
        add_hour_cost(conn, int(row.created_ms), delta, 0)
        scopes.cost_changed(conn, int(row.id), int(row.created_ms), delta)  # R-SC-1


def _to_reservation(row: Row[Any], replayed: bool = False) -> Reservation:
    r = row._mapping
    return Reservation(
        id=int(r["id"]),
        source=str(r["source_id"]),
        model=str(r["model_key"]),
        created_ms=int(r["created_ms"]),
        deadline_ms=int(r["deadline_ms"]),
        estimate_micro=r["estimate_micro"],
        role=AttemptRole(r["role"]),
        status=AttemptStatus(r["status"]),
        request_id=r["request_id"],
        replayed=replayed,
        pool=r["pool"],
        effort=r["effort"],
    )


_NEWEST_OF_SOURCE = (
    select(reservations.c.id)
    .where(reservations.c.source_id == bindparam("source_id"))
    .order_by(reservations.c.id.desc())
    .limit(1)
)


@dataclass(frozen=True)
class _Role:
    """The role the ledger records, with what it is based on (never the caller's word alone)."""

    role: AttemptRole
    fallback_from: str | None = None
    after_id: int | None = None  # set when this is the permitted immediate follow-up
    # a follow-up's: the pool its request's first attempt was reserved through as the primary
    # (R-RT-5a: the requested pool, whose chain is the allowlist of the backups after it)
    requested_pool: str | None = None


def _reservation(
    conn: Connection, reservation_id: int, query: Select[Any] = _BY_ID
) -> Row[Any] | None:
    """The reservation row with this id, or None; an id no row of this backend can have (past
    PostgreSQL's 32-bit or SQLite's 64-bit id column) is None too, never a database error."""
    if not dialects.can_be_row_id(conn, reservation_id):
        return None
    return conn.execute(query, {"b_id": reservation_id}).first()


def _held(conn: Connection, row: Row[Any]) -> dict[tuple[CooldownScope, str], int]:
    """The targets a settling reservation is the probe of (none read unless it holds one)."""
    r = row._mapping
    if not r["holds_probe"]:
        return {}
    return probes.held_by(conn, int(r["id"]), int(r["deadline_ms"]))


def _permitted_follow_up(
    conn: Connection, now: int, request: ReserveRequest, after_id: int
) -> _Role | None:
    """The follow-up `after_id` permits for this request, or None (R-POL-4, issue 12 item 6).

    Granted only when the named reservation is this source's newest one, failed, stored a
    follow-up permission, was not itself a follow-up, and the request fits that permission: a
    fallback goes to another model, a correction to the same one. Only within the failed
    reservation's own queue item (issue 20 item 3): never after its deadline plus
    FOLLOW_UP_GRACE_MS, and never once a worker released the source after the failure.
    """
    failed = _reservation(conn, after_id)
    if failed is None or failed.source_id != request.source_id:
        # a typo must not silently turn into a plain reservation: bad input, nothing written
        raise UsageError("after names no reservation of this source")
    if failed.status != AttemptStatus.FAILED.value:
        return None
    if failed.after_id is not None and failed.follow_up is None:
        return None  # a follow-up permits another only at interactive pace (stored then, R-GW-4)
    if now > failed.deadline_ms + FOLLOW_UP_GRACE_MS or _released_since(conn, failed):
        return None
    newest = conn.execute(_NEWEST_OF_SOURCE, {"source_id": request.source_id}).scalar()
    if newest != after_id or failed.follow_up is None:
        return None
    same_model = request.model.key == failed.model_key
    role = None
    if failed.follow_up == FollowUp.CORRECTION.value and same_model:
        role = _Role(AttemptRole.CORRECTION, after_id=after_id)
    elif failed.follow_up == FollowUp.FALLBACK.value and not same_model:
        role = _Role(AttemptRole.FALLBACK, str(failed.model_key), after_id)
    elif failed.follow_up == FollowUp.RETRY.value and same_model:
        role = _Role(AttemptRole.RETRY, after_id=after_id)
    if role is None:
        return None
    return replace(role, requested_pool=_requested_pool(conn, failed))


_FOR_REQUESTED_POOL = select(
    reservations.c.after_id, reservations.c.pool, reservations.c.role
).where(reservations.c.id == bindparam("b_id"))


def _requested_pool(conn: Connection, failed: Row[Any]) -> str | None:
    """`pool/NAME` when the request a follow-up belongs to named that pool (R-RT-5a): its first
    attempt (the root of the `after_id` links, one read per earlier follow-up: at interactive
    pace only) was reserved through the pool as the primary. Else None: a concrete first attempt,
    or a pool reached as a chain's backup, leaves the primary to `_primary`'s other rules."""
    row: Row[Any] | None = failed
    while row is not None and row.after_id is not None:  # ids only decrease: it ends
        row = _reservation(conn, int(row.after_id), _FOR_REQUESTED_POOL)
    if row is None or row.pool is None or row.role != AttemptRole.PRIMARY.value:
        return None
    return f"pool/{row.pool}"


_RELEASED_AFTER = select(sources.c.id).where(
    sources.c.id == bindparam("source_id"),
    sources.c.in_queue.is_(True),
    sources.c.last_checked_ms > bindparam("settled_ms"),
)


def _released_since(conn: Connection, failed: Row[Any]) -> bool:
    """A queued source's item ended after this failure: a worker's release stamps
    `last_checked_ms`. Within an item only a reserve refused for a cooling route moves it too,
    and such a refusal ends a worker's item anyway."""
    params = {"source_id": failed.source_id, "settled_ms": failed.settled_ms}
    return conn.execute(_RELEASED_AFTER, params).first() is not None


def _checked_role(
    conn: Connection, now: int, request: ReserveRequest, source: budgets.SourceBudget
) -> tuple[_Role, bool]:
    """The role to record and whether this is the permitted immediate follow-up (item 10).

    A caller's role and `fallback_from` are checked against the ledger, never trusted: a
    fallback names a model this source used, a correction repeats one.
    """
    if request.override:
        return _Role(AttemptRole.OVERRIDE), False
    follow = None
    if request.immediate_after is not None:
        follow = _permitted_follow_up(conn, now, request, request.immediate_after)
    if follow is not None:
        if request.role not in (AttemptRole.PRIMARY, follow.role) or (
            request.fallback_from not in (None, follow.fallback_from)
        ):
            raise UsageError(f"the failed reservation permits a {follow.role}, not this attempt")
        return follow, True
    key = request.model.key
    if request.role is AttemptRole.FALLBACK:
        origin = request.fallback_from
        if origin is None or origin == key or origin not in source.models:
            raise UsageError("a fallback must name another model this source already used")
        return _Role(AttemptRole.FALLBACK, origin), False
    if request.role is AttemptRole.CORRECTION and key not in source.models:
        raise UsageError("a correction must repeat a model this source already used")
    if request.role is AttemptRole.OVERRIDE:
        raise UsageError("an override is asked for with override=True")
    if request.role is AttemptRole.RETRY:
        raise UsageError("a retry follows the failed reservation it names with after=")
    if request.fallback_from is not None:
        raise UsageError("fallback_from goes with role=fallback")
    return _Role(request.role), False


def _primary(
    conn: Connection,
    policy: Policy,
    request: ReserveRequest,
    source: budgets.SourceBudget,
    recorded: _Role,
) -> str:
    """The source's primary model: the pool the caller named (R-RT-5a), else defaultModel, else
    the first model it used, else this one.

    A follow-up (`after=`) belongs to the request of the attempt it follows: its primary is the
    pool that request named, so the backups after a failed pool candidate are held to that
    pool's chain, as `select` offers them, whatever defaultModel says; a pool a follow-up
    reaches as a backup is never its primary (R-RT-1 holds it to the chain it came from)."""
    if recorded.requested_pool is not None:  # the request named the pool: its candidates are
        return recorded.requested_pool  # primaries, its chain the backups' allowlist (R-RT-5a)
    if request.via_pool is not None and recorded.after_id is None:  # the caller named the pool:
        return f"pool/{request.via_pool}"  # whatever defaultModel and chains say (R-RT-5a)
    if policy.default_model is not None:
        return primary_key(policy.default_model) or policy.default_model
    unconfined = not (policy.fallback_models or policy.default_chain or policy.chains)
    if not source.models or (policy.cross_provider_fallback and unconfined):
        return request.model.key  # nothing confines the source: no need to look it up
    return reads.first_model(conn, request.source_id) or request.model.key


def reserve(
    conn: Connection, now: int, policy: Policy, request: ReserveRequest, policy_fp: str
) -> Reservation | budgets.Refusal:
    """All checks of R-RES-1..9 and the insert, inside the caller's write transaction; through a
    pool, the pool's choice among the candidates eligible now (R-RT-5) in the same transaction.
    A gateway key's source is checked first, in the same transaction (R-SC-3a)."""
    if request.gateway_key is not None:
        _check_key_source(conn, request)
    if request.pool is not None:
        return _reserve_pool(conn, now, policy, request, request.pool, policy_fp)
    return _reserve_model(conn, now, policy, request, policy_fp)


def _check_key_source(conn: Connection, request: ReserveRequest) -> None:
    """R-SC-3a: a gateway key may name a source under at least one scope, all of them among the
    key's, or a source new to the ledger (then made under the key's scopes on a grant); never an
    unscoped one. Read in the reserving transaction, so two keys racing to make one new source
    cannot both have it: the second finds it under the first's scopes."""
    found = set(conn.execute(_SOURCE_AND_SCOPES, {"b_id": request.source_id}).scalars())
    if found and (None in found or not found <= set(request.scopes)):
        raise SourceScopeMismatch


def _reserve_model(
    conn: Connection, now: int, policy: Policy, request: ReserveRequest, policy_fp: str
) -> Reservation | budgets.Refusal:
    """R-RES-1..9 and the insert for one concrete model."""
    model = request.model
    if request.request_id is not None:
        ids = {"b_namespace": request.namespace, "request_id": request.request_id}
        row = conn.execute(_BY_REQUEST_ID, ids).first()
        if row is not None:
            if row.source_id != request.source_id or row.model_key != model.key:
                raise UsageError("this request id was already used for another source or model")
            return _to_reservation(row, replayed=True)
    source = reads.source_budget(conn, request.source_id)
    new_source = source is None
    if source is None and request.existing:
        raise NotFoundError("unknown source")
    if source is None:  # created on first use, but only with a grant (a refusal writes nothing)
        source = budgets.SourceBudget(SourceState.QUEUED, None, 0, frozenset(), 0)
    # R-SC-1: the scopes' use is read in the same round trip as the shared state, and checked
    # after every check of section 7 below (see ledger/store/scopes.py)
    if request.gateway_key is not None:  # `reserve` checked its source has none but these (R-SC-3a)
        names = list(request.scopes)
    else:
        names = scopes.names_for(
            conn, policy, request.source_id, request.scopes, stored=not new_source
        )
    shared, scope_values = reads.shared_state(
        conn,
        now,
        policy.calls_per_hour,
        model.provider,
        model.key,
        scopes.plan(now, [(name, policy.scopes[name]) for name in names]),
    )
    daily = 0
    if policy.daily_estimated_usd is not None:
        daily = reads.daily_cost(conn, now)
    gate = shared.gate
    state = budgets.BudgetState(
        now_ms=now,
        hourly_count=shared.hourly,
        hourly_next_free_ms=shared.hourly_next_free_ms,
        daily_cost_micro=daily,
        source=source,
        provider_cooldown_until=shared.provider_until,
        model_cooldown_until=shared.model_until,
        probe_held_until=gate.held_until,
    )
    estimate = budgets.estimate_micro(model, request.input_bytes, policy.reply_tokens)
    recorded, immediate = _checked_role(conn, now, request, source)
    verdict = admission.check(
        state,
        policy,
        model,
        estimate,
        override=request.override,
        immediate=immediate,
        primary=_primary(conn, policy, request, source, recorded),
        retry=recorded.role is AttemptRole.RETRY,
    )
    if isinstance(verdict, budgets.Refusal):
        ceiling = budgets.ceiling_micro(policy)
        if verdict.reason == RefusalReason.DAILY_COST_CEILING and ceiling is not None:
            # when enough of the 24 h cost has left the window for this estimate (item 15);
            # only a refusal pays for reading the window's rows
            window = reads.daily_window(conn, now, ceiling)
            verdict = budgets.Refusal(
                verdict.reason, budgets.ceiling_frees_at(now, window, estimate or 0)
            )
        if verdict.reason in {"provider_cooldown", "model_cooldown", "probing"}:
            # R-POL-6: temporarily unroutable work moves behind other eligible work
            conn.execute(_TOUCH_SOURCE, {"b_id": request.source_id, "b_now": now})
        return verdict
    # R-SC-1: every scope's limits, after every check above
    scoped = scopes.check(conn, now, policy, names, scope_values, verdict.estimate_micro)
    if isinstance(scoped, budgets.Refusal):
        return scoped
    if new_source:
        insert_source(conn, request.source_id, now)
        if request.gateway_key is not None and request.scopes:  # R-SC-3a: under the key's scopes
            rows = [{"source_id": request.source_id, "scope": s} for s in request.scopes]
            conn.execute(_INSERT_SOURCE_SCOPE, rows)
    if shared.overdue:
        expire_open(conn, now)
    role = recorded.role
    new_id = conn.execute(
        _INSERT_RESERVATION,
        {
            "request_id": request.request_id,
            "namespace": request.namespace,
            "source_id": request.source_id,
            "model_key": model.key,
            "provider": model.provider,
            "role": role.value,
            "fallback_from": recorded.fallback_from,
            "after_id": recorded.after_id,
            "follow_up": None,
            "created_ms": now,
            "deadline_ms": verdict.deadline_ms,
            "input_bytes": request.input_bytes,
            "estimate_micro": verdict.estimate_micro,
            "status": AttemptStatus.OPEN.value,
            "cost_micro": verdict.estimate_micro,
            "policy_fp": policy_fp,
            "pool": request.via_pool,
            "effort": request.effort,
            "sticky_scope": request.sticky_scope,
        },
    ).inserted_primary_key
    assert new_id is not None
    add_hour_cost(conn, now, verdict.estimate_micro or 0, 1)
    scopes.record(conn, int(new_id[0]), scoped, now, verdict.estimate_micro)
    if gate.armed and not request.override:  # R-POL-9: the first reservation is the probe
        probes.claim(conn, gate.armed, int(new_id[0]), verdict.deadline_ms)
    if model.key not in source.models:
        conn.execute(
            _INSERT_SOURCE_MODEL,
            {"source_id": request.source_id, "model_key": model.key, "first_ms": now},
        )
    if not new_source:  # a new one was inserted checked now
        conn.execute(_TOUCH_SOURCE, {"b_id": request.source_id, "b_now": now})
    return Reservation(
        id=int(new_id[0]),
        source=request.source_id,
        model=model.key,
        created_ms=now,
        deadline_ms=verdict.deadline_ms,
        estimate_micro=verdict.estimate_micro,
        role=role,
        status=AttemptStatus.OPEN,
        request_id=request.request_id,
        pool=request.via_pool,
        effort=request.effort,
    )


# ------------------------------------------------------------------------ pools (R-RT-4..6)

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


def _reserve_pool(
    conn: Connection,
    now: int,
    policy: Policy,
    request: ReserveRequest,
    plan: PoolPlan,
    policy_fp: str,
) -> Reservation | budgets.Refusal:
    """The pool's choice and the reservation, in the caller's write transaction (R-RT-5)."""
    if request.request_id is not None:
        ids = {"b_namespace": request.namespace, "request_id": request.request_id}
        row = conn.execute(_BY_REQUEST_ID, ids).first()
        if row is not None:
            if row.source_id != request.source_id or row.pool != plan.pool:
                raise UsageError("this request id was already used for another source or model")
            return _to_reservation(row, replayed=True)
    spec = policy.pools[plan.pool]
    scope = None
    if spec.sticky != "off":
        scope = request.source_id if spec.sticky_scope == "source" else ""
    refusals: list[budgets.Refusal] = []
    errors: list[UsageError] = []
    base = replace(request, pool=None, via_pool=plan.pool, sticky_scope=scope)
    chosen = _choose(
        conn, now, policy, base, plan, plan.pool, plan.effort, policy_fp, refusals, errors
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
                cand.effort or effort, policy_fp, refusals, errors, sticky_key,
            )
        else:
            model = plan.models.get(cand.key)
            if model is None or cand.key == request.fallback_from:
                continue  # not callable for this request, or the model that just failed
            concrete = replace(request, model=model, effort=cand.effort or effort)
            try:
                result = _reserve_model(conn, now, policy, concrete, policy_fp)
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


def _settle_lease(conn: Connection, now: int, row: Row[Any], success: bool) -> None:
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
    row = _reservation(conn, reservation_id, _FOR_SETTLE)
    if row is None:
        raise NotFoundError("unknown reservation")
    if row.status not in reads.OPEN_LIKE:
        raise UsageError("this reservation is already settled")
    if isinstance(outcome, Failed) and outcome.classification.kind is FailureKind.CANCELLED:
        outcome = Cancelled()  # issue 12 item 9: a reported `cancelled` is the cancelled row
    late = now > row.deadline_ms or overran
    duration = max(0, now - row.created_ms)
    model = catalog.model(row.model_key)
    base = {"settled_ms": now, "duration_ms": duration, "late": late}
    where = reservations.c.id == reservation_id
    if isinstance(outcome, Success):
        return _settle_success(conn, now, row, model, outcome, late, base)
    if isinstance(outcome, Cancelled):
        held = _held(conn, row)
        probe_actions = probes.settle_probes(
            conn, now, held, FailureKind.CANCELLED, (), claimed_ms=int(row.created_ms)
        )
        # usage seen before the cut (R-GW-7) is recorded; the cost moves only when it is complete
        usage = _usage(model, outcome) if outcome.usage_seen else {}
        actual = usage.get("actual_micro")
        cost = actual if actual is not None else row.cost_micro
        marked = {"subkind": "usage_estimated"} if outcome.usage_estimated else {}
        conn.execute(
            update(reservations)
            .where(where)
            .values(
                status=AttemptStatus.CANCELLED.value,
                kind=FailureKind.CANCELLED.value,
                **usage,
                **({"cost_micro": cost} if actual is not None else {}),
                **marked,
                **base,
            )
        )
        _cost_changed(conn, row, cost)
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
    return _settle_failure(conn, now, row, model, outcome, late, base, jitter, pace)


def _usage(model: Model | None, outcome: Success | Failed | Cancelled) -> dict[str, int | None]:
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
    usage = _usage(model, outcome)
    actual = usage["actual_micro"]
    cost = actual if actual is not None else r["estimate_micro"]
    conn.execute(
        _UPDATE_RESERVATION,
        {
            "b_id": r["id"],
            "status": AttemptStatus.SUCCEEDED.value,
            **usage,
            "cost_micro": cost,
            **base,
            **({"subkind": "usage_estimated"} if outcome.usage_estimated else {}),
        },
    )
    _cost_changed(conn, row, cost)
    if not late:
        _settle_lease(conn, now, row, success=True)
    actions: list[str] = []
    if r["has_strikes"]:
        conn.execute(_CLEAR_STRIKES, {"model_key": r["model_key"]})
    held = _held(conn, row)
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


def _settle_failure(
    conn: Connection,
    now: int,
    row: Row[Any],
    model: Model | None,
    outcome: Failed,
    late: bool,
    base: dict[str, object],
    jitter: Callable[[], float],
    pace: InteractivePace | None = None,
) -> SettleResult:
    r = row._mapping
    cls = outcome.classification
    src = conn.execute(select(sources).where(sources.c.id == r["source_id"])).one()._mapping
    strikes = conn.execute(
        select(func.count())
        .select_from(transport_strikes)
        .where(
            transport_strikes.c.model_key == r["model_key"],
            transport_strikes.c.at_ms > now - STRIKE_WINDOW_MS,
        )
    ).scalar_one()
    provider = str(r["provider"])
    existing = {
        (scope, target): until
        for scope, target in (
            (CooldownScope.PROVIDER, provider),
            (CooldownScope.MODEL, str(r["model_key"])),
        )
        if (until := reads.cooldown_until(conn, scope, target, now)) is not None
    }
    held = _held(conn, row)
    decision: Decision = decide(
        FailureContext(
            classification=cls,
            model_key=str(r["model_key"]),
            now_ms=now,
            recent_transport_strikes=int(strikes),
            failures=int(src["failures"]),
            output_failures=int(src["output_failures"]),
            backoff_steps=int(src["backoff_steps"]),
            correction_used=bool(src["correction_used"]),
            side_effects=outcome.side_effects,
            was_follow_up=r["after_id"] is not None,
            override=r["role"] == AttemptRole.OVERRIDE.value,
            existing_cooldowns=existing,
            probe_streaks=held,
            pace=pace,
        ),
        jitter,
    )
    usage = _usage(model, outcome)
    actual = usage["actual_micro"]
    cost = actual if actual is not None else r["estimate_micro"]
    actions = list(decision.actions)
    follow_up = None
    immediate = r["after_id"] is None and r["role"] != AttemptRole.OVERRIDE.value
    if decision.use_correction and immediate:
        follow_up = FollowUp.CORRECTION.value
    elif decision.retry_after_ms is not None:
        follow_up = FollowUp.RETRY.value
    elif decision.fallback is not None:
        follow_up = FollowUp.FALLBACK.value
    conn.execute(
        update(reservations)
        .where(reservations.c.id == r["id"])
        .values(
            follow_up=follow_up,
            status=AttemptStatus.FAILED.value,
            kind=decision.kind.value,
            subkind=decision.subkind,
            reason=decision.reason,
            side_effects=outcome.side_effects,
            **usage,
            cost_micro=cost,
            **base,
        )
    )
    _cost_changed(conn, row, cost)
    for action in decision.cooldowns:
        upsert_cooldown(
            conn,
            now,
            action.scope,
            action.target,
            action.until_ms,
            action.kind.value,
            action.origin,
        )
        probes.arm(conn, action.scope, action.target)  # policy and hint cooldowns end in a probe
    actions += probes.settle_probes(
        conn,
        now,
        held,
        decision.kind,
        [(a.scope, a.target) for a in decision.cooldowns],
        claimed_ms=int(r["created_ms"]),
    )
    health.record(conn, now, provider, str(r["model_key"]), decision.kind.value)
    _settle_lease(conn, now, row, success=False)
    pause_reason = apply_to_source(conn, now, src, decision, str(r["model_key"]))
    if decision.transport_strike:
        conn.execute(insert(transport_strikes).values(model_key=r["model_key"], at_ms=now))
    source_id = str(r["source_id"])
    if pause_reason != decision.pause_reason:
        actions.append("not paused: the source is finished (R-RES-3)")
    if late:
        actions.append("late: usage recorded; the result must not be committed")
    return SettleResult(
        int(r["id"]),
        source_id,
        str(r["model_key"]),
        AttemptStatus.FAILED,
        late,
        kind=decision.kind.value,
        subkind=decision.subkind,
        reason=decision.reason,
        actions=tuple(actions),
        fallback=None if decision.fallback is None else decision.fallback.value,
        use_correction=decision.use_correction,
        retry_after_ms=decision.retry_after_ms,
        paused=pause_reason,
        cost_micro=cost,
    )


def apply_to_source(
    conn: Connection,
    now: int,
    src: RowMapping,
    decision: Decision,
    model_key: str,
    message: str | None = None,
) -> str | None:
    """Write one failure's decision to its source (`src`: its row, read in the caller's write
    transaction): counters, backoff, owed correction, pause, and the deduplicated failure and
    pause notices (R-DIAG-4). Returns the pause reason written; a finished source is never
    paused (R-RES-3)."""
    changes: dict[str, object] = {}
    if decision.counts_failure:
        changes["failures"] = sources.c.failures + 1
    if decision.counts_output_failure:
        changes["output_failures"] = sources.c.output_failures + 1
    if decision.backoff_until_ms is not None:
        changes["retry_at_ms"] = decision.backoff_until_ms
        changes["backoff_steps"] = sources.c.backoff_steps + 1
    if decision.use_correction:
        changes["correction_used"] = True
        changes["correction_reason"] = decision.reason
    pause_reason = decision.pause_reason
    if src["state"] == SourceState.DONE.value:
        pause_reason = None  # R-RES-3: finished is final, never flipped to paused
    if pause_reason is not None:
        # the lease stays with its worker, which releases it (resume cannot hand it out)
        changes["state"] = SourceState.PAUSED.value
        changes["pause_reason"] = pause_reason
    source_id = str(src["id"])
    if changes:
        conn.execute(update(sources).where(sources.c.id == source_id).values(**changes))
    if decision.counts_failure:
        record_notice(
            conn,
            now,
            "failure",
            # keyed by everything the message says, so a count never misstates it (R-DIAG-4)
            f"failure:{source_id}:{decision.kind.value}:{decision.subkind}:{model_key}",
            message or f"{decision.kind.value} ({decision.subkind}) on {model_key}",
            source_id,
        )
    if pause_reason is not None:
        record_pause(conn, now, source_id, pause_reason)
    return pause_reason
