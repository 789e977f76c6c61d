"""The work queue's SQL (R-Q-1, R-Q-2, R-POL-6): claim, renew and release leases on sources.

Invariant: every function here is exactly ONE transaction — the ones that decide and write run in
`db.write()` (BEGIN IMMEDIATE, ledger time read after the lock), so two workers can never both
claim one source, and only the current lease owner can renew or release a lease.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    BindParameter,
    ColumnElement,
    Connection,
    Row,
    and_,
    bindparam,
    exists,
    func,
    or_,
    select,
    update,
)

from ledger.budgets.checks import spent_reason
from ledger.classify import Classification
from ledger.config import Policy
from ledger.kinds import AttemptRole, AttemptStatus, FailureKind, SourceState
from ledger.policy_table import OUTPUT_FAILURE_CAP, FailureContext, backoff_ms, decide
from ledger.store import reads
from ledger.store.engine import Database
from ledger.store.notices import record_pause
from ledger.store.pending import rehearsed
from ledger.store.reads import source_budget
from ledger.store.reservations import apply_to_source
from ledger.store.schema import reservations, source_scopes, sources
from ledger.store.views import active_cooldowns

_QUEUED = SourceState.QUEUED.value
_LEASED = SourceState.LEASED.value
_PAUSED = SourceState.PAUSED.value


@dataclass(frozen=True)
class PendingCorrection:
    """A corrective prompt the source is owed (persisted: it survives cancellation and restart)."""

    model: str
    reason: str


@dataclass(frozen=True)
class OwedFallback:
    """The alternate model the source is owed after its 2nd output failure (SPEC 8, R-POL-4).

    Derived from the ledger on every claim, so it survives the end of the queue item, a
    cancellation and a restart: `failed_model` is the failed attempt's model,
    `tried` every model that gave this source an output failure. `deferred` is True once the
    generic backoff was applied because no alternate was eligible; the same model may then be
    probed again.
    """

    failed_model: str
    tried: frozenset[str]
    deferred: bool


@dataclass(frozen=True)
class Claim:
    """A source leased to one worker until `lease_expires_ms`."""

    source_id: str
    payload_ref: str | None
    worker_id: str
    claimed_ms: int
    lease_expires_ms: int
    correction: PendingCorrection | None = None
    owed_fallback: OwedFallback | None = None


def _due(now: ColumnElement[int] | int) -> ColumnElement[bool]:
    """Queued (or leased with an expired lease), in the queue, retry time reached (R-Q-2).

    `state = queued OR state = leased` is implied by the rest; it is spelled out so the claim index
    serves each state as a range and the finished sources (a day's worth of them after a busy
    day) are never scanned.
    """
    return and_(
        sources.c.in_queue.is_(True),
        or_(sources.c.state == _QUEUED, sources.c.state == _LEASED),
        or_(sources.c.state == _QUEUED, sources.c.lease_expires_ms <= now),
        or_(sources.c.retry_at_ms.is_(None), sources.c.retry_at_ms <= now),
    )


GATEWAY_ONE_OFF_PREFIX = "gw-"
"""The id prefix of the source the gateway makes for a request without `X-Ledger-Source`
(R-GW-2: each such request is its own source)."""


def gateway_one_off() -> ColumnElement[bool]:
    """A gateway request's own source: a `gw-` id never enqueued, still in the state every new
    source starts in. It is no queue work: no claim takes it (`in_queue` is false) and status
    counts it apart from `queued`. Enqueued (`source add`), it is queue work like any other."""
    return and_(
        sources.c.in_queue.is_(False),
        sources.c.state == _QUEUED,
        # substr, not LIKE: exact and case-sensitive on both backends
        func.substr(sources.c.id, 1, len(GATEWAY_ONE_OFF_PREFIX)) == GATEWAY_ONE_OFF_PREFIX,
    )


_CLAIM_ORDER = (sources.c.last_checked_ms, sources.c.id)
_NOW = bindparam("now", type_=BigInteger)
# the whole row: the pending correction and the owed fallback are read from it too
_NEXT_DUE = select(sources).where(_due(_NOW)).order_by(*_CLAIM_ORDER).limit(1)
_NEXT_DUE_UNCHECKED = (
    select(sources)
    .where(_due(_NOW), sources.c.last_checked_ms <= bindparam("checked_before"))
    .order_by(*_CLAIM_ORDER)
    .limit(1)
)
_SKIP_SCOPES: BindParameter[str] = bindparam("skip_scopes", expanding=True)
# the same, leaving out the sources added under any of `skip_scopes` (a scope whose token window
# is full for the pass, R-TOK-2)
_NEXT_DUE_UNCHECKED_OUTSIDE = (
    select(sources)
    .where(
        _due(_NOW),
        sources.c.last_checked_ms <= bindparam("checked_before"),
        ~exists().where(
            source_scopes.c.source_id == sources.c.id, source_scopes.c.scope.in_(_SKIP_SCOPES)
        ),
    )
    .order_by(*_CLAIM_ORDER)
    .limit(1)
)
_LEASE = (
    update(sources)
    .where(sources.c.id == bindparam("b_id"))
    .values(state=_LEASED, lease_owner=bindparam("b_owner"), lease_expires_ms=bindparam("b_exp"))
)
_HAS_WORK = select(
    exists().where(
        sources.c.in_queue.is_(True),
        or_(sources.c.state == _QUEUED, sources.c.state == _LEASED),
    )
)


@rehearsed
def claim(
    db: Database,
    worker_id: str,
    lease_ms: int,
    *,
    checked_before: int | None = None,
    skip_scopes: frozenset[str] = frozenset(),
) -> Claim | None:
    """Lease the due source with the oldest `last_checked_ms` (tie: id), or None (one write txn).

    `checked_before` limits the claim to sources not looked at since that ledger time, so one
    drain pass visits each source at most once; with it, `skip_scopes` leaves out the sources
    added under any of those scopes (their token window is full for the rest of the pass).
    """
    with db.write() as txn:
        now = txn.now
        if checked_before is None:
            row = txn.conn.execute(_NEXT_DUE, {"now": now}).first()
        elif skip_scopes:
            params = {"now": now, "checked_before": checked_before,
                      "skip_scopes": sorted(skip_scopes)}  # fmt: skip
            row = txn.conn.execute(_NEXT_DUE_UNCHECKED_OUTSIDE, params).first()
        else:
            row = txn.conn.execute(
                _NEXT_DUE_UNCHECKED, {"now": now, "checked_before": checked_before}
            ).first()
        if row is None:
            return None
        expires = now + lease_ms
        txn.conn.execute(_LEASE, {"b_id": row.id, "b_owner": worker_id, "b_exp": expires})
        return Claim(
            source_id=str(row.id),
            payload_ref=row.payload_ref,
            worker_id=worker_id,
            claimed_ms=now,
            lease_expires_ms=expires,
            correction=_pending_correction(txn.conn, row),
            owed_fallback=_owed_fallback(txn.conn, row),
        )


def _pending_correction(conn: Connection, src: Row[Any]) -> PendingCorrection | None:
    """The corrective prompt granted after the first output failure, if it was never carried out
    (`src`: the claimed source's row, read in the same transaction)."""
    source_id = str(src.id)
    if not src.correction_used or src.output_failures != 1:
        return None
    done = conn.execute(
        select(
            exists().where(
                reservations.c.source_id == source_id,
                reservations.c.role == AttemptRole.CORRECTION.value,
                reservations.c.status.in_(
                    (AttemptStatus.SUCCEEDED.value, AttemptStatus.FAILED.value)
                ),
            )
        )
    ).scalar()
    if done:
        return None
    failed = conn.execute(
        select(reservations.c.model_key, reservations.c.reason, reservations.c.subkind)
        .where(
            reservations.c.source_id == source_id,
            reservations.c.kind == FailureKind.INVALID_OUTPUT.value,
        )
        .order_by(reservations.c.id.desc())
        .limit(1)
    ).first()
    if failed is None:
        return None
    return PendingCorrection(str(failed.model_key), str(failed.reason or failed.subkind))


def _owed_fallback(conn: Connection, src: Row[Any]) -> OwedFallback | None:
    """The alternate model owed after the 2nd output failure, if no attempt followed it yet
    (`src`: the claimed source's row, read in the same transaction)."""
    source_id = str(src.id)
    if src.output_failures != OUTPUT_FAILURE_CAP - 1:
        return None
    newest = conn.execute(
        select(reservations.c.model_key, reservations.c.kind, reservations.c.settled_ms)
        .where(
            reservations.c.source_id == source_id,
            # only attempts with an outcome: a cancelled one adds no failure, and one that
            # expired unsettled (its worker died in the call) leaves the alternate still owed
            reservations.c.status.in_(
                (AttemptStatus.FAILED.value, AttemptStatus.SUCCEEDED.value)
            ),
        )
        .order_by(reservations.c.id.desc())
        .limit(1)
    ).first()
    if newest is None or newest.kind != FailureKind.INVALID_OUTPUT.value:
        return None
    tried = conn.execute(
        select(reservations.c.model_key)
        .distinct()
        .where(
            reservations.c.source_id == source_id,
            reservations.c.kind == FailureKind.INVALID_OUTPUT.value,
        )
    ).scalars()
    deferred = src.retry_at_ms is not None and int(src.retry_at_ms) > int(newest.settled_ms or 0)
    return OwedFallback(str(newest.model_key), frozenset(str(m) for m in tried), deferred)


_HELD_BY = (
    sources.c.id == bindparam("h_id"),
    or_(sources.c.state == _LEASED, sources.c.state == _PAUSED),
    sources.c.lease_owner == bindparam("h_owner"),
)
"""This worker's lease on the source is still in place (R-Q-2); parameters from `_held_by`.

Nobody else has claimed the source since (a claim replaces the owner) and it was not finished.
A source paused while leased keeps its lease until its worker releases it or the lease expires,
so `source resume` cannot hand it to a second worker meanwhile. The statements below are built
once (executing a prebuilt statement skips its construction on every lease operation).
"""
_H_NOW = bindparam("h_now", type_=BigInteger)
_RENEW = update(sources).where(*_HELD_BY).values(lease_expires_ms=bindparam("h_until"))
_RENEW_UNPAUSED = _RENEW.where(sources.c.state == _LEASED)
_FINISH = (
    update(sources)
    .where(*_HELD_BY)
    .values(
        state=SourceState.DONE.value, finished_ms=_H_NOW, lease_owner=None, lease_expires_ms=None
    )
)
_RELEASE_LEASED = (
    update(sources)
    .where(*_HELD_BY, sources.c.state == _LEASED)
    .values(state=_QUEUED, last_checked_ms=_H_NOW, lease_owner=None, lease_expires_ms=None)
)
_PAUSE_SPENT = (
    update(sources)
    .where(*_HELD_BY, sources.c.state == _LEASED)
    .values(
        state=_PAUSED,
        pause_reason=bindparam("h_reason"),
        last_checked_ms=_H_NOW,
        lease_owner=None,
        lease_expires_ms=None,
    )
)
_RELEASE_PAUSED = (
    update(sources)
    .where(*_HELD_BY, sources.c.state == _PAUSED)
    .values(last_checked_ms=_H_NOW, lease_owner=None, lease_expires_ms=None)
)


def _held_by(source_id: str, worker_id: str, **more: int) -> dict[str, Any]:
    """The parameters of `_HELD_BY` (plus the statement's own)."""
    return {"h_id": source_id, "h_owner": worker_id, **more}


def renew(
    db: Database,
    source_id: str,
    worker_id: str,
    lease_ms: int,
    *,
    cover_until_ms: int = 0,
    unpaused: bool = False,
) -> bool:
    """Extend a lease this worker still holds to max(now + lease_ms, cover_until_ms).

    `cover_until_ms` is a reservation's deadline: the lease covers the whole call it authorises,
    whatever `leaseMs` is (issue 12 item 3). With `unpaused`, a source paused meanwhile counts as
    not held (a worker never commits into a pause). False when the lease was lost (one write txn).
    """
    with db.write() as txn:
        until = max(txn.now + lease_ms, cover_until_ms)
        result = txn.conn.execute(
            _RENEW_UNPAUSED if unpaused else _RENEW,
            _held_by(source_id, worker_id, h_until=until),
        )
        return bool(result.rowcount)


def finish(db: Database, source_id: str, worker_id: str) -> bool:
    """Mark the source done only while this worker still holds its lease (R-Q-1, R-RES-3): the
    check and the write are one transaction, so a lease lost in between cannot finish a source
    another worker now holds. False when the lease was lost."""
    with db.write() as txn:
        result = txn.conn.execute(_FINISH, _held_by(source_id, worker_id, h_now=txn.now))
        return bool(result.rowcount)


def release(db: Database, source_id: str, worker_id: str) -> bool:
    """Back to `queued` with last_checked = now, lease cleared; only the owner may (one txn).

    A source that was finished or paused meanwhile keeps its state (a paused one just loses the
    lease); the retry time is never touched here (R-POL-6).
    """
    with db.write() as txn:
        return _release(txn.conn, _held_by(source_id, worker_id, h_now=txn.now))


def _release(conn: Connection, held: dict[str, Any]) -> bool:
    """`release` inside the caller's transaction; True when the source went back to `queued`."""
    if conn.execute(_RELEASE_LEASED, held).rowcount:
        return True
    conn.execute(_RELEASE_PAUSED, held)
    return False


def release_spent(db: Database, source_id: str, worker_id: str, policy: Policy) -> str | None:
    """Give the lease back; a source that has used its `sourceCalls` or `sourceTimeMs` is paused
    with that reason instead of queued again (one write txn).

    Its counters only grow, so every later claim would be refused the same way: paused, it
    leaves the queue until an operator raises the cap and resumes it (or finishes it), and the
    pause is a notice. Returns the pause reason; None when the source was released as usual
    (not spent after all) or the lease was lost.
    """
    with db.write() as txn:
        held = _held_by(source_id, worker_id, h_now=txn.now)
        budget = source_budget(txn.conn, source_id)
        reason = None if budget is None else spent_reason(policy, budget)
        # the pause only lands while this worker still holds the source, leased
        if reason is not None and txn.conn.execute(
            _PAUSE_SPENT, {**held, "h_reason": reason.value}
        ).rowcount:
            record_pause(txn.conn, txn.now, source_id, reason.value)
            return reason.value
        _release(txn.conn, held)
        return None


def defer_owed_fallback(
    db: Database, source_id: str, worker_id: str, jitter: Callable[[], float]
) -> int | None:
    """No alternate for an owed fallback: the generic backoff (R-POL-3) before the same model
    is probed again; no failure is added. Returns the new retry time (None: lease lost)."""
    with db.write() as txn:
        steps = txn.conn.execute(
            select(sources.c.backoff_steps).where(*_HELD_BY), _held_by(source_id, worker_id)
        ).scalar()
        if steps is None:
            return None
        until = txn.now + backoff_ms(int(steps), jitter)
        txn.conn.execute(
            update(sources)
            .where(sources.c.id == source_id)
            .values(retry_at_ms=until, backoff_steps=sources.c.backoff_steps + 1)
        )
        return until


COMMIT_FAILED = Classification(FailureKind.UNKNOWN, "commit_failed")
"""A handler's commit that raised after a good call: the `unknown` row's generic bounded retry."""


@dataclass(frozen=True)
class CommitFailure:
    """What a failed commit did to its source: the backoff it set and the pause, if any."""

    retry_at_ms: int | None
    paused: str | None


def commit_failed(
    db: Database, source_id: str, worker_id: str, model_key: str, jitter: Callable[[], float]
) -> CommitFailure | None:
    """Count a failed commit as one failure of the source (issue 20 item 1, one write txn).

    The call succeeded (its reservation stays `succeeded`, the provider's health is untouched),
    but the result was not taken: the source gets the generic backoff (R-POL-3), the failure
    counts toward the failure cap (R-POL-5) and a notice says so, so a commit that keeps failing
    costs one provider call per backoff period instead of the source's every call at once.
    None when the lease was lost meanwhile (the source is another worker's now).
    """
    with db.write() as txn:
        src = txn.conn.execute(
            select(sources).where(*_HELD_BY), _held_by(source_id, worker_id)
        ).first()
        if src is None:
            return None
        row = src._mapping
        decision = decide(
            FailureContext(
                classification=COMMIT_FAILED,
                model_key=model_key,
                now_ms=txn.now,
                recent_transport_strikes=0,
                failures=int(row["failures"]),
                output_failures=int(row["output_failures"]),
                backoff_steps=int(row["backoff_steps"]),
                correction_used=bool(row["correction_used"]),
                was_follow_up=True,  # the item is over: nothing follows at once
            ),
            jitter,
        )
        message = f"commit failed on {model_key}: the call succeeded, the handler's commit raised"
        paused = apply_to_source(txn.conn, txn.now, row, decision, model_key, message)
        return CommitFailure(decision.backoff_until_ms, paused)


@dataclass(frozen=True)
class QueueTimes:
    """When something in the queue next becomes due (read-only snapshot)."""

    now_ms: int
    next_retry_ms: int | None
    next_lease_expiry_ms: int | None


_NEXT_RETRY = select(func.min(sources.c.retry_at_ms)).where(
    sources.c.in_queue.is_(True),
    or_(sources.c.state == _QUEUED, sources.c.state == _LEASED),
    sources.c.retry_at_ms > _NOW,
)
_NEXT_LEASE_EXPIRY = select(func.min(sources.c.lease_expires_ms)).where(
    sources.c.in_queue.is_(True),
    sources.c.state == _LEASED,
    sources.c.lease_expires_ms > _NOW,
)


def queue_times(db: Database) -> QueueTimes:
    """The soonest future retry time and lease expiry among queued work (one read txn)."""
    with db.read() as conn:
        now = db.read_now(conn)
        retry = conn.execute(_NEXT_RETRY, {"now": now}).scalar()
        lease = conn.execute(_NEXT_LEASE_EXPIRY, {"now": now}).scalar()
        return QueueTimes(
            now, None if retry is None else int(retry), None if lease is None else int(lease)
        )


_ANY_DUE = select(exists().where(_due(_NOW)))


def any_due(db: Database, at_ms: int) -> bool:
    """True when a claim at `at_ms` would find a source, as things stand (one read txn)."""
    with db.read() as conn:
        return bool(conn.execute(_ANY_DUE, {"now": at_ms}).scalar())


def has_work(db: Database) -> bool:
    """True while a source in the queue is queued or leased, due or not (one read txn)."""
    with db.read() as conn:
        return bool(conn.execute(_HAS_WORK).scalar())


def ledger_now(db: Database) -> int:
    """The ledger's current time (never before the newest stored time), read-only."""
    with db.read() as conn:
        return db.read_now(conn)


@dataclass(frozen=True)
class QueueTotals:
    """Facts about the queue and the budgets, for the demo and the soak report (one read txn)."""

    now_ms: int
    states: dict[str, int]
    attempts: int
    fallbacks: int
    cross_provider_fallbacks: int
    corrections: int
    active_cooldowns: int
    hourly_used: int
    daily_cost_micro: int


def totals(db: Database, calls_per_hour: int) -> QueueTotals:
    """Counts by source state, attempts by role, active cooldowns and budget use right now."""
    with db.read() as conn:
        now = db.read_now(conn)
        states = {
            str(state): int(n)
            for state, n in conn.execute(
                select(sources.c.state, func.count()).group_by(sources.c.state)
            )
        }
        roles = {
            str(role): int(n)
            for role, n in conn.execute(
                select(reservations.c.role, func.count()).group_by(reservations.c.role)
            )
        }
        cross = 0
        for provider, fallback_from in conn.execute(
            select(reservations.c.provider, reservations.c.fallback_from).where(
                reservations.c.role == AttemptRole.FALLBACK.value
            )
        ):
            if fallback_from and str(fallback_from).split("/", 1)[0] != provider:
                cross += 1
        hourly, _ = reads.hourly_usage(conn, now, calls_per_hour)
        daily = reads.daily_cost(conn, now)
        return QueueTotals(
            now_ms=now,
            states=states,
            attempts=sum(roles.values()),
            fallbacks=roles.get(AttemptRole.FALLBACK.value, 0),
            cross_provider_fallbacks=cross,
            corrections=roles.get(AttemptRole.CORRECTION.value, 0),
            active_cooldowns=len(active_cooldowns(conn, now)),
            hourly_used=hourly,
            daily_cost_micro=daily,
        )
