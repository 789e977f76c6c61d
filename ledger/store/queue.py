"""The work queue's SQL (R-Q-1, R-Q-2, R-POL-6): claim, renew and release leases on sources.

Invariant: every function here is exactly ONE transaction — the ones that decide and write run in
`db.write()` (BEGIN IMMEDIATE, ledger time read after the lock), so two workers can never both
claim one source, and only the current lease owner can renew or release a lease.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, and_, exists, func, or_, select, update

from ledger.kinds import AttemptRole, AttemptStatus, FailureKind, SourceState
from ledger.store.engine import Database
from ledger.store.schema import reservations, sources

_QUEUED = SourceState.QUEUED.value
_LEASED = SourceState.LEASED.value


@dataclass(frozen=True)
class PendingCorrection:
    """A corrective prompt the source is owed (persisted: it survives cancellation and restart)."""

    model: str
    reason: str


@dataclass(frozen=True)
class Claim:
    """A source leased to one worker until `lease_expires_ms`."""

    source_id: str
    payload_ref: str | None
    worker_id: str
    claimed_ms: int
    lease_expires_ms: int
    correction: PendingCorrection | None = None


def _due(now: int) -> ColumnElement[bool]:
    """Queued (or leased with an expired lease), in the queue, retry time reached (R-Q-2)."""
    return and_(
        sources.c.in_queue.is_(True),
        or_(
            sources.c.state == _QUEUED,
            and_(sources.c.state == _LEASED, sources.c.lease_expires_ms <= now),
        ),
        or_(sources.c.retry_at_ms.is_(None), sources.c.retry_at_ms <= now),
    )


def claim(
    db: Database, worker_id: str, lease_ms: int, *, checked_before: int | None = None
) -> Claim | None:
    """Lease the due source with the oldest `last_checked_ms` (tie: id), or None (one write txn).

    `checked_before` limits the claim to sources not looked at since that ledger time, so one
    drain pass visits each source at most once.
    """
    with db.write() as txn:
        now = txn.now
        query = select(sources.c.id, sources.c.payload_ref).where(_due(now))
        if checked_before is not None:
            query = query.where(sources.c.last_checked_ms <= checked_before)
        row = txn.conn.execute(
            query.order_by(sources.c.last_checked_ms, sources.c.id).limit(1)
        ).first()
        if row is None:
            return None
        expires = now + lease_ms
        txn.conn.execute(
            update(sources)
            .where(sources.c.id == row.id)
            .values(state=_LEASED, lease_owner=worker_id, lease_expires_ms=expires)
        )
        return Claim(
            source_id=str(row.id),
            payload_ref=row.payload_ref,
            worker_id=worker_id,
            claimed_ms=now,
            lease_expires_ms=expires,
            correction=_pending_correction(txn.conn, str(row.id)),
        )


def _pending_correction(conn: Connection, source_id: str) -> PendingCorrection | None:
    """The corrective prompt granted after the first output failure, if it was never carried out."""
    src = conn.execute(
        select(sources.c.correction_used, sources.c.output_failures).where(
            sources.c.id == source_id
        )
    ).one()
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


def _held_by(source_id: str, worker_id: str) -> tuple[ColumnElement[bool], ...]:
    """The source is leased, and by this worker."""
    return (
        sources.c.id == source_id,
        sources.c.state == _LEASED,
        sources.c.lease_owner == worker_id,
    )


def renew(db: Database, source_id: str, worker_id: str, lease_ms: int) -> bool:
    """Extend a lease this worker still holds to now + lease_ms; False when it lost the lease."""
    with db.write() as txn:
        result = txn.conn.execute(
            update(sources)
            .where(*_held_by(source_id, worker_id))
            .values(lease_expires_ms=txn.now + lease_ms)
        )
        return bool(result.rowcount)


def release(db: Database, source_id: str, worker_id: str) -> bool:
    """Back to `queued` with last_checked = now, lease cleared; only the owner may (one txn).

    A source that was finished or paused meanwhile keeps its state (its lease is already cleared);
    the retry time is never touched here (R-POL-6).
    """
    with db.write() as txn:
        result = txn.conn.execute(
            update(sources)
            .where(*_held_by(source_id, worker_id))
            .values(state=_QUEUED, last_checked_ms=txn.now, lease_owner=None, lease_expires_ms=None)
        )
        return bool(result.rowcount)


@dataclass(frozen=True)
class QueueTimes:
    """When something in the queue next becomes due (read-only snapshot)."""

    now_ms: int
    next_retry_ms: int | None
    next_lease_expiry_ms: int | None


def queue_times(db: Database) -> QueueTimes:
    """The soonest future retry time and lease expiry among queued work (one read txn)."""
    with db.read() as conn:
        now = db.read_now(conn)
        retry = conn.execute(
            select(func.min(sources.c.retry_at_ms)).where(
                sources.c.in_queue.is_(True),
                sources.c.state.in_((_QUEUED, _LEASED)),
                sources.c.retry_at_ms > now,
            )
        ).scalar()
        lease = conn.execute(
            select(func.min(sources.c.lease_expires_ms)).where(
                sources.c.in_queue.is_(True),
                sources.c.state == _LEASED,
                sources.c.lease_expires_ms > now,
            )
        ).scalar()
        return QueueTimes(
            now, None if retry is None else int(retry), None if lease is None else int(lease)
        )


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
    from ledger.store import reads
    from ledger.store.views import active_cooldowns

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
        daily, _ = reads.daily_cost(conn, now)
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
