"""Reserve: exactly one write transaction (R-DB-2) that reads, decides and writes.

The verdict is pure (ledger.admission.check over the budgets of ledger.budgets.unit); this module
reads what it needs in the reserving transaction (the shared state and every applicable budget's
use in one round trip, ledger/store/usage.py) and writes what it returns. Through a pool the
choice among candidates is ledger/store/pool_choice.py's, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from ledger import admission
from ledger.budgets import checks as budgets
from ledger.budgets import unit
from ledger.budgets.unit import Budget, Dimension, Measure, Stage, UsageKey, Use, Window
from ledger.config import Policy
from ledger.errors import NotFoundError, SourceScopeMismatch, UsageError
from ledger.kinds import AttemptRole, AttemptStatus, RefusalReason, SourceState
from ledger.records import Reservation
from ledger.store import learned, probes, reads, roles, scopes, usage
from ledger.store.costs import add_hour_cost, add_hour_tokens
from ledger.store.hot import Hot
from ledger.store.pool_choice import reserve_pool
from ledger.store.requests import BY_REQUEST_ID, ReserveRequest, to_reservation
from ledger.store.schema import reservations, source_models, source_scopes, sources
from ledger.tokens import tokens_for_bytes

# row: a source new to the ledger)
_SOURCE_AND_SCOPES = (
    select(source_scopes.c.scope)
    .select_from(sources.outerjoin(source_scopes, source_scopes.c.source_id == sources.c.id))
    .where(sources.c.id == bindparam("b_id"))
)
_INSERT_SOURCE_SCOPE = insert(source_scopes)
_INSERT_SOURCE = insert(sources)
_INSERT_RESERVATION = insert(reservations)
_INSERT_SOURCE_MODEL = insert(source_models)
_TOUCH_SOURCE = Hot(
    update(sources)
    .where(sources.c.id == bindparam("b_id"))
    .values(last_checked_ms=bindparam("b_now"))
)
_RESERVATION_KEYS = (
    "request_id", "namespace", "source_id", "model_key", "provider", "role", "fallback_from",
    "after_id", "follow_up", "created_ms", "deadline_ms", "input_bytes", "estimate_micro",
    "status", "cost_micro", "policy_fp", "pool", "effort", "sticky_scope",
    "estimate_input_tokens", "estimate_output_tokens",
)  # fmt: skip
_HOT_INSERT_RESERVATION = Hot(
    _INSERT_RESERVATION, keys=_RESERVATION_KEYS, returning_id=reservations.c.id
)
_HOT_INSERT_SOURCE = Hot(
    _INSERT_SOURCE,
    keys=("id", "state", "in_queue", "payload_ref", "created_ms", "last_checked_ms"),
)
_HOT_INSERT_SOURCE_MODEL = Hot(_INSERT_SOURCE_MODEL, keys=("source_id", "model_key", "first_ms"))
_EXPIRE_OPEN = (
    update(reservations)
    .where(
        reservations.c.status == AttemptStatus.OPEN.value,
        reservations.c.deadline_ms <= bindparam("b_now"),
    )
    .values(status=AttemptStatus.EXPIRED.value)
)


def insert_source(
    conn: Connection,
    source_id: str,
    now: int,
    *,
    in_queue: bool = False,
    payload_ref: str | None = None,
) -> None:
    """Create a source the caller found missing, in the caller's write transaction."""
    _HOT_INSERT_SOURCE.rowcount(
        conn,
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


def reserve(
    conn: Connection,
    now: int,
    policy: Policy,
    request: ReserveRequest,
    policy_fp: str,
    extra: Sequence[Budget] = (),
) -> Reservation | budgets.Refusal:
    """All checks of R-RES-1..9 and the insert, inside the caller's write transaction; through a
    pool, the pool's choice among the candidates eligible now (R-RT-5) in the same transaction.
    A gateway key's source is checked first, in the same transaction (R-SC-3a). `extra`: budgets
    checked besides the policy's (ledger.budgets.unit), each at its stage."""
    if request.gateway_key is not None:
        _check_key_source(conn, request)
    if request.pool is not None:

        def one(c: Connection, n: int, p: Policy, r: ReserveRequest, fp: str) -> Any:
            return reserve_model(c, n, p, r, fp, extra)

        return reserve_pool(conn, now, policy, request, request.pool, policy_fp, one)
    return reserve_model(conn, now, policy, request, policy_fp, extra)


def _check_key_source(conn: Connection, request: ReserveRequest) -> None:
    """R-SC-3a: a gateway key may name a source under at least one scope, all of them among the
    key's, or a source new to the ledger (then made under the key's scopes on a grant); never an
    unscoped one. Read in the reserving transaction, so two keys racing to make one new source
    cannot both have it: the second finds it under the first's scopes."""
    found = set(conn.execute(_SOURCE_AND_SCOPES, {"b_id": request.source_id}).scalars())
    if found and (None in found or not found <= set(request.scopes)):
        raise SourceScopeMismatch


_LAST: list[tuple[Policy, dict[Any, _Applying]]] = []
"""The budgets of the policy last reserved under, per scopes and added budgets (a policy is read
once per process, R-HOME-3): built once, not on every reserve."""


@dataclass(frozen=True)
class _Applying:
    """The budgets a reserve under some scopes checks, by stage, and those `usage.plan` reads."""

    stages: dict[Stage, tuple[Budget, ...]]
    read: tuple[Budget, ...]


def _applying(policy: Policy, names: Sequence[str], extra: Sequence[Budget]) -> _Applying:
    """The policy's budgets and `extra` that apply under `names` (unit.applicable), cached."""
    cached = _LAST[0][1] if _LAST and _LAST[0][0] is policy else None
    if cached is None:
        cached = {}
        _LAST[:] = [(policy, cached)]
    found = cached.get(key := (tuple(names), tuple(extra)))
    if found is None:
        stages = unit.applicable((*unit.budgets_of(policy), *extra), names)
        read = tuple(b for s in stages.values() for b in s if usage.read_here(b))
        found = cached[key] = _Applying(stages, read)
    return found


_HOUR_KEY: tuple[Window, Measure, Dimension, str] = (
    Window.ROLLING_HOUR, Measure.CALLS, Dimension.GLOBAL, ""
)
_COOLING = frozenset(
    {RefusalReason.PROVIDER_COOLDOWN, RefusalReason.MODEL_COOLDOWN, RefusalReason.PROBING}
)


def reserve_model(
    conn: Connection,
    now: int,
    policy: Policy,
    request: ReserveRequest,
    policy_fp: str,
    extra: Sequence[Budget] = (),
) -> Reservation | budgets.Refusal:
    """R-RES-1..9, R-SC-1 and the insert for one concrete model."""
    model = request.model
    if request.request_id is not None:
        ids = {"b_namespace": request.namespace, "request_id": request.request_id}
        row = conn.execute(BY_REQUEST_ID, ids).first()
        if row is not None:
            if row.source_id != request.source_id or row.model_key != model.key:
                raise UsageError("this request id was already used for another source or model")
            return to_reservation(row, replayed=True)
    source = reads.source_budget(conn, request.source_id)
    new_source = source is None
    if source is None and request.existing:
        raise NotFoundError("unknown source")
    if source is None:  # created on first use, but only with a grant (a refusal writes nothing)
        source = budgets.SourceBudget(SourceState.QUEUED, None, 0, frozenset(), 0)
    if request.gateway_key is not None:  # `reserve` checked its source has none but these (R-SC-3a)
        names = list(request.scopes)
    else:
        names = scopes.names_for(
            conn, policy, request.source_id, request.scopes, stored=not new_source
        )
    estimate = budgets.estimate_micro(model, request.input_bytes, policy.reply_tokens)
    # R-TOK-2: the input's bound (R-SEL-8 from its size) and the reply allowance granted
    input_tokens = tokens_for_bytes(request.input_bytes)
    output_tokens = model.reply_reservation(policy.reply_tokens)
    asked = unit.Request(
        now,
        request.source_id,
        model.provider,
        model.key,
        names,
        {
            Measure.CALLS: 1,
            Measure.COST: estimate,
            Measure.TIME: 1,  # at least a millisecond left (R-RES-8)
            Measure.MODELS: 0 if model.key in source.models else 1,
            Measure.TOKENS: input_tokens + output_tokens,
            Measure.INPUT_TOKENS: input_tokens,
            Measure.OUTPUT_TOKENS: output_tokens,
        },
    )
    applying = _applying(policy, names, extra)
    # every budget's use is read in the same round trip as the shared state (R-DB-2)
    keys = list(dict.fromkeys(unit.key(b, asked) for b in applying.read))
    also = usage.plan(now, keys, conn.dialect.name)
    if policy.learn_limits:  # R-TOK-4: what the provider reported left, in the same read
        also = learned.plan(also, now, model.provider, model.id)
    shared, values = reads.shared_state(
        conn, now, policy.calls_per_hour, model.provider, model.key, also
    )
    values, left = learned.split(values) if policy.learn_limits else (values, {})
    uses = usage.uses(keys, values)
    uses[_HOUR_KEY] = usage.hour_use(shared.hourly, shared.hourly_next_free_ms,
                                     policy.calls_per_hour)
    uses.update(usage.from_source(request.source_id, source.calls, len(source.models),
                                  source.time_used_ms))
    gate = shared.gate
    state = admission.BudgetState(
        asked, applying.stages, uses, source, shared.provider_until, shared.model_until,
        gate.held_until,
    )
    recorded, immediate = roles.checked_role(conn, now, request, source)
    verdict = admission.check(
        state,
        policy,
        model,
        estimate,
        override=request.override,
        immediate=immediate,
        primary=roles.primary(conn, policy, request, source, recorded),
        retry=recorded.role is AttemptRole.RETRY,
    )
    if left and not isinstance(verdict, budgets.Refusal):  # R-TOK-4, after every other check
        verdict = learned.refused(conn, left, asked.amounts, model.provider, model.id) or verdict
    if isinstance(verdict, budgets.Refusal):
        if verdict.reason in _COOLING:
            # R-POL-6: temporarily unroutable work moves behind other eligible work
            _TOUCH_SOURCE.rowcount(conn, {"b_id": request.source_id, "b_now": now})
        return _with_retry(conn, verdict, uses, asked)
    if new_source:
        insert_source(conn, request.source_id, now)
        if request.gateway_key is not None and request.scopes:  # R-SC-3a: under the key's scopes
            rows = [{"source_id": request.source_id, "scope": s} for s in request.scopes]
            conn.execute(_INSERT_SOURCE_SCOPE, rows)
    if shared.overdue:
        expire_open(conn, now)
    role = recorded.role
    new_id = _HOT_INSERT_RESERVATION.new_id(
        conn,
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
            "estimate_input_tokens": input_tokens,
            "estimate_output_tokens": output_tokens,
        },
    )
    add_hour_cost(conn, now, verdict.estimate_micro or 0, 1)
    add_hour_tokens(conn, now, model.key, model.provider, (input_tokens, output_tokens))
    scopes.record(conn, new_id, names, now, verdict.estimate_micro, (input_tokens, output_tokens))
    if gate.armed and not request.override:  # R-POL-9: the first reservation is the probe
        probes.claim(conn, gate.armed, new_id, verdict.deadline_ms)
    if model.key not in source.models:
        _HOT_INSERT_SOURCE_MODEL.rowcount(
            conn, {"source_id": request.source_id, "model_key": model.key, "first_ms": now}
        )
    if not new_source:  # a new one was inserted checked now
        _TOUCH_SOURCE.rowcount(conn, {"b_id": request.source_id, "b_now": now})
    return Reservation(
        id=new_id,
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
        estimate_input_tokens=input_tokens,
        estimate_output_tokens=output_tokens,
    )


def _with_retry(
    conn: Connection, refusal: budgets.Refusal, uses: dict[UsageKey, Use], asked: unit.Request
) -> budgets.Refusal:
    """A budget's refusal with when its window frees: the rows saying so are read for a refusal
    only (on every reserve they would cost a grant), then the pure check answers again."""
    budget = refusal.budget
    if budget is None or refusal.retry_at_ms is not None or budget.window is Window.LIFETIME:
        return refusal
    amount = asked.amounts.get(budget.measure)
    found = uses.get(key := unit.key(budget, asked))
    if amount is None or found is None or found.leaving is not None:
        return refusal
    uses[key] = usage.leaving(conn, asked.now_ms, budget, key, found, amount)
    return unit.check((budget,), uses, asked) or refusal
