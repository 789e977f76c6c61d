"""The role a reserve records (R-POL-4, R-GW-4, R-RT-5a): checked against the ledger, never
the caller's word alone, and the source's primary model the privacy boundary holds backups to."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    bindparam,
    select,
)

from ledger.budgets import checks as budgets
from ledger.config import Policy
from ledger.errors import UsageError
from ledger.kinds import (
    AttemptRole,
    AttemptStatus,
    FollowUp,
)
from ledger.routing.chains import primary_key
from ledger.store import reads
from ledger.store.requests import ReserveRequest
from ledger.store.schema import (
    reservations,
    sources,
)

FOLLOW_UP_GRACE_MS = 10_000
"""How long after the failed reservation's deadline its immediate follow-up may still be
reserved (a settle and a reserve of the same queue item, each maybe waiting for the write lock)."""

_NEWEST_OF_SOURCE = (
    select(reservations.c.id)
    .where(reservations.c.source_id == bindparam("source_id"))
    .order_by(reservations.c.id.desc())
    .limit(1)
)


@dataclass(frozen=True)
class Role:
    """The role the ledger records, with what it is based on (never the caller's word alone)."""

    role: AttemptRole
    fallback_from: str | None = None
    after_id: int | None = None  # set when this is the permitted immediate follow-up
    # a follow-up's: the pool its request's first attempt was reserved through as the primary
    # (R-RT-5a: the requested pool, whose chain is the allowlist of the backups after it)
    requested_pool: str | None = None


def _permitted_follow_up(
    conn: Connection, now: int, request: ReserveRequest, after_id: int
) -> Role | None:
    """The follow-up `after_id` permits for this request, or None (R-POL-4, issue 12 item 6).

    Granted only when the named reservation is this source's newest one, failed, stored a
    follow-up permission, was not itself a follow-up, and the request fits that permission: a
    fallback goes to another model, a correction to the same one. Only within the failed
    reservation's own queue item (issue 20 item 3): never after its deadline plus
    FOLLOW_UP_GRACE_MS, and never once a worker released the source after the failure.
    """
    failed = reads.reservation_row(conn, after_id)
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
        role = Role(AttemptRole.CORRECTION, after_id=after_id)
    elif failed.follow_up == FollowUp.FALLBACK.value and not same_model:
        role = Role(AttemptRole.FALLBACK, str(failed.model_key), after_id)
    elif failed.follow_up == FollowUp.RETRY.value and same_model:
        role = Role(AttemptRole.RETRY, after_id=after_id)
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
    or a pool reached as a chain's backup, leaves the primary to `primary`'s other rules."""
    row: Row[Any] | None = failed
    while row is not None and row.after_id is not None:  # ids only decrease: it ends
        row = reads.reservation_row(conn, int(row.after_id), _FOR_REQUESTED_POOL)
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


def checked_role(
    conn: Connection, now: int, request: ReserveRequest, source: budgets.SourceBudget
) -> tuple[Role, bool]:
    """The role to record and whether this is the permitted immediate follow-up (item 10).

    A caller's role and `fallback_from` are checked against the ledger, never trusted: a
    fallback names a model this source used, a correction repeats one.
    """
    if request.override:
        return Role(AttemptRole.OVERRIDE), False
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
        return Role(AttemptRole.FALLBACK, origin), False
    if request.role is AttemptRole.CORRECTION and key not in source.models:
        raise UsageError("a correction must repeat a model this source already used")
    if request.role is AttemptRole.OVERRIDE:
        raise UsageError("an override is asked for with override=True")
    if request.role is AttemptRole.RETRY:
        raise UsageError("a retry follows the failed reservation it names with after=")
    if request.fallback_from is not None:
        raise UsageError("fallback_from goes with role=fallback")
    return Role(request.role), False


def primary(
    conn: Connection,
    policy: Policy,
    request: ReserveRequest,
    source: budgets.SourceBudget,
    recorded: Role,
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
