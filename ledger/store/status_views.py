"""Read queries behind `ledger status` (R-DIAG-1): one short deferred read transaction, no writes.

Every query is bounded so status stays fast with a million historic attempts (issue 7 item 6):
reservations are only read through an index, either inside the rolling 24 h window
(`ix_reservations_created`), by `LIMIT` in index order, or for the capped list of shown sources
(`ix_reservations_source`). Nothing here scans the reservations table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, case, func, select

from ledger.budgets.checks import DAY_MS, HOUR_MS
from ledger.budgets.scopes import ScopeUse
from ledger.config import Policy
from ledger.health import Health, HealthCounters, HourCount, ProbeState, health_view
from ledger.kinds import AttemptRole, CooldownScope, SourceState
from ledger.store import learned, reads, refusal_counts, scopes, sqlite_driver
from ledger.store.engine import Database
from ledger.store.learned import LiveLimit
from ledger.store.migrate import read_revision
from ledger.store.queue import _CLAIM_ORDER, _NEXT_RETRY, _due, gateway_one_off
from ledger.store.refusal_counts import RefusalTotal
from ledger.store.schema import (
    daily_totals,
    health,
    notices,
    probes,
    reservations,
    source_models,
    sources,
)
from ledger.store.token_views import TokenWindowUse, token_uses
from ledger.store.views import CooldownRow, active_cooldowns, policy_writers

SOURCE_LIST_LIMIT = 50
RECENT_LIMIT = 20
NOTICE_LIMIT = 10
FAILOVER_LIMIT = 20
QUEUE_OLDEST_LIMIT = 5
HOURS = DAY_MS // HOUR_MS  # the per-hour buckets of the rolling 24 h window
HISTORY_DAYS = 30
# Leased work first, then what needs an operator (paused), then what waits (queued).
_STATE_ORDER = (SourceState.LEASED, SourceState.PAUSED, SourceState.QUEUED)


@dataclass(frozen=True)
class DailyUsage:
    """The rolling 24 h window: what the cost ceiling counts, plus tokens and unknown costs."""

    attempts: int
    spent_micro: int
    unknown_cost_attempts: int
    input_tokens: int
    output_tokens: int
    cache_write_tokens: int
    cache_read_tokens: int


@dataclass(frozen=True)
class DayTotal:
    """One compacted day of history (R-DB-6), summed over models."""

    day: str
    attempts: int
    succeeded: int
    failed: int
    input_tokens: int
    output_tokens: int
    cost_micro: int
    unknown_cost: int
    cache_write_tokens: int
    cache_read_tokens: int


@dataclass(frozen=True)
class SourceSummary:
    """One shown source with its counters (archived history included)."""

    id: str
    state: str
    calls: int
    models: tuple[str, ...]
    failures: int
    output_failures: int
    time_used_ms: int
    pause_reason: str | None
    retry_at_ms: int | None
    lease_expires_ms: int | None
    open_allowance_ms: int = 0  # the part of time_used_ms that unsettled reservations count


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as the recent-outcomes table shows it (no text of any kind is stored)."""

    id: int
    created_ms: int
    source_id: str
    model_key: str
    provider: str
    role: str
    status: str
    kind: str | None
    subkind: str | None
    duration_ms: int | None
    late: bool


@dataclass(frozen=True)
class ModelOutcome:
    """Attempts in the 24 h window for one (model, status, kind)."""

    provider: str
    model_key: str
    status: str
    kind: str | None
    count: int


@dataclass(frozen=True)
class HourOutcome:
    """Attempts of one (status, kind) in one hour of the rolling 24 h window; `hour` 0 is the
    oldest: it covers (now - 24 h, now - 23 h], hour 23 ends at now."""

    hour: int
    status: str
    kind: str | None
    count: int
    cost_micro: int
    unknown_cost: int


@dataclass(frozen=True)
class FailoverRow:
    """A fallback attempt in the last 24 h: which model it left, where it went, and why."""

    created_ms: int
    source_id: str
    from_model: str | None
    to_model: str
    kind: str | None  # the kind of the failed attempt it follows (None when not recorded)
    status: str


@dataclass(frozen=True)
class NoticeRow:
    """A deduplicated notice (R-DIAG-4)."""

    category: str
    message: str
    source_id: str | None
    first_ms: int
    last_ms: int
    count: int


@dataclass(frozen=True)
class PolicyWriter:
    """A policy fingerprint stamped on reservations in the last 24 h (R-HOME-3)."""

    fingerprint: str
    last_seen_ms: int
    reservations: int
    first_seen_ms: int


@dataclass(frozen=True)
class QueuedRow:
    """A source in the worker queue, in claim order (R-Q-2): what a claim would look at next."""

    id: str
    state: str
    last_checked_ms: int
    retry_at_ms: int | None
    lease_expires_ms: int | None


@dataclass(frozen=True)
class QueueData:
    """The worker queue (R-Q-2): due now, when the next one is due, the first few in claim order."""

    due_now: int
    next_due_ms: int | None
    oldest: list[QueuedRow]


@dataclass(frozen=True)
class StatusData:
    """Everything status reads at ledger time `now_ms` (a few short read transactions)."""

    now_ms: int
    cooldowns: list[CooldownRow]
    hourly_used: int
    hourly_next_free_ms: int | None
    daily: DailyUsage
    history: list[DayTotal]
    source_counts: dict[str, int]
    sources: list[SourceSummary]
    recent: list[AttemptRow]
    outcomes: list[ModelOutcome]
    hours: list[HourOutcome]
    failovers: list[FailoverRow]
    notices: list[NoticeRow]
    writers: list[PolicyWriter]
    health: list[Health]
    backend: str
    sqlite_library: str | None
    sqlite_version: str | None
    journal_mode: str | None
    journal_mode_chosen: str | None
    revision: str | None
    scopes: list[ScopeUse] = field(default_factory=list)  # R-SC-2: each scope's use
    queue: QueueData | None = None
    refusals: list[RefusalTotal] = field(default_factory=list)  # R-DIAG-1: the last hour's
    token_budgets: list[TokenWindowUse] = field(default_factory=list)  # R-TOK-5
    learned_limits: tuple[LiveLimit, ...] = ()  # R-TOK-4, R-TOK-5: the live readings


def status_data(db: Database, calls_per_hour: int, policy: Policy | None = None) -> StatusData:
    """Read the whole status picture at one ledger time, in a few short deferred read
    transactions (the policy's scopes' use too, when it is given).

    Each scan of the 24 h window gets a snapshot of its own, and every snapshot starts where the
    WAL can start over (`Database.read(long=True)`): a reader that builds this document back to
    back then never pins the log for longer than one group of reads (issue 46 item 2). What must
    agree is read together: the budgets, cooldowns and health with the state they describe; the
    hours with the daily totals they partition. Between groups only commits that landed
    meanwhile can differ, and every group counts at the same ledger time `now`."""
    with db.read(long=True) as conn:  # what a reserve checks now, and the health it explains
        now = db.read_now(conn)
        used, next_free = reads.hourly_usage(conn, now, calls_per_hour)
        cooling = active_cooldowns(conn, now)
        health_now = health_view(
            now,
            [(c.scope, c.target, c.until_ms) for c in cooling],
            probe_states(conn),
            health_counters(conn),
            hour_counts(conn, now),
        )
        history = day_totals(conn)
        counts = source_counts(conn)
        summaries = source_summaries(conn, now)
        recent = recent_attempts(conn, now)
        notices_now = recent_notices(conn)
        journal_mode = _journal_mode(conn) if db.is_sqlite else None
        revision = read_revision(conn)  # a plain read: status never loads alembic
        scope_uses = [] if policy is None else scopes.status_uses(conn, now, policy)
        queue = queue_data(conn, now)
        refusals = refusal_counts.last_hour(conn, now)
        tokens = [] if policy is None else token_uses(conn, now, policy)
        learned_now = learned.live(conn, now) if policy is None or policy.learn_limits else ()
    with db.read(long=True) as conn:  # the hours partition the window the daily totals count
        daily = daily_usage(conn, now)
        hours = hour_outcomes(conn, now)
    with db.read(long=True) as conn:
        outcomes = model_outcomes(conn, now)
    with db.read(long=True) as conn:
        writers = [PolicyWriter(*row) for row in policy_writers(conn, now)]
        failovers = recent_failovers(conn, now)
    return StatusData(
        now_ms=now,
        cooldowns=cooling,
        hourly_used=used,
        hourly_next_free_ms=next_free,
        daily=daily,
        history=history,
        source_counts=counts,
        sources=summaries,
        recent=recent,
        outcomes=outcomes,
        hours=hours,
        failovers=failovers,
        notices=notices_now,
        writers=writers,
        health=health_now,
        backend=db.engine.dialect.name,
        sqlite_library=sqlite_driver.LIBRARY if db.is_sqlite else None,
        sqlite_version=sqlite_driver.library_version() if db.is_sqlite else None,
        journal_mode=journal_mode,
        # what this ledger asks of the linked library (R-DB-3a); the value stored when the
        # database was created may predate the durable rollback journal
        journal_mode_chosen=db.journal_mode if db.is_sqlite else None,
        revision=revision,
        scopes=scope_uses,
        queue=queue,
        refusals=refusals,
        token_budgets=tokens,
        learned_limits=learned_now,
    )


def queue_data(conn: Connection, now: int, limit: int = QUEUE_OLDEST_LIMIT) -> QueueData:
    """The worker queue as a claim sees it (R-Q-2), read through the claim index: how many
    sources are due now, when the next one waiting for its retry time becomes due,
    and the first `limit` queued or leased sources in claim order (oldest check first)."""

    s = sources.c
    waiting = and_(s.in_queue.is_(True), s.state.in_([SourceState.QUEUED.value,
                                                      SourceState.LEASED.value]))
    due_now = int(
        conn.execute(select(func.count()).select_from(sources).where(_due(now))).scalar_one()
    )
    retry = conn.execute(_NEXT_RETRY, {"now": now}).scalar_one()
    rows = conn.execute(
        select(s.id, s.state, s.last_checked_ms, s.retry_at_ms, s.lease_expires_ms)
        .where(waiting)
        .order_by(*_CLAIM_ORDER)
        .limit(limit)
    ).all()
    return QueueData(
        due_now=due_now,
        next_due_ms=None if retry is None else int(retry),
        oldest=[
            QueuedRow(
                str(r.id),
                str(r.state),
                int(r.last_checked_ms),
                None if r.retry_at_ms is None else int(r.retry_at_ms),
                None if r.lease_expires_ms is None else int(r.lease_expires_ms),
            )
            for r in rows
        ],
    )


def probe_states(conn: Connection) -> list[ProbeState]:
    """Every target armed for a recovery probe (one row per probing or cooling target)."""
    p = probes.c
    return [
        ProbeState(CooldownScope(scope), str(target), int(streak), deadline)
        for scope, target, streak, deadline in conn.execute(
            select(p.scope, p.target, p.streak, p.holder_deadline_ms)
        )
    ]


def health_counters(conn: Connection) -> list[HealthCounters]:
    """The stored health counters (one row per provider and model that settled an attempt)."""
    h = health.c
    rows = conn.execute(
        select(
            h.scope,
            h.target,
            h.consecutive_failures,
            h.last_failure_kind,
            h.last_failure_ms,
            h.last_success_ms,
        )
    )
    return [
        HealthCounters(CooldownScope(scope), str(target), int(n), kind, failed, succeeded)
        for scope, target, n, kind, failed, succeeded in rows
    ]


def hour_counts(conn: Connection, now: int) -> list[HourCount]:
    """Attempts per model created in the last hour and how many failed (bounded by the hourly
    budget: read through ix_reservations_created)."""
    r = reservations.c
    failed = func.coalesce(func.sum(case((r.status == "failed", 1), else_=0)), 0)
    rows = conn.execute(
        select(r.provider, r.model_key, func.count(), failed)
        .where(r.created_ms > now - HOUR_MS)
        .group_by(r.provider, r.model_key)
    )
    return [HourCount(str(p), str(m), int(n), int(f)) for p, m, n, f in rows]


def _journal_mode(conn: Connection) -> str | None:
    value = conn.exec_driver_sql("PRAGMA journal_mode").scalar()  # a fixed literal
    return None if value is None else str(value)


def daily_usage(conn: Connection, now: int) -> DailyUsage:
    """Cost, unknown-cost attempts and tokens over the rolling 24 h window."""
    r = reservations.c
    row = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(r.cost_micro), 0),
            func.coalesce(func.sum(case((r.cost_micro.is_(None), 1), else_=0)), 0),
            func.coalesce(func.sum(r.input_tokens), 0),
            func.coalesce(func.sum(r.output_tokens), 0),
            func.coalesce(func.sum(r.cache_write_tokens), 0),
            func.coalesce(func.sum(r.cache_read_tokens), 0),
        ).where(r.created_ms > now - DAY_MS)
    ).one()
    return DailyUsage(*(int(v) for v in row))


def day_totals(conn: Connection, days: int = HISTORY_DAYS) -> list[DayTotal]:
    """Compacted per-day history, newest day first."""
    d = daily_totals.c
    rows = conn.execute(
        select(
            d.day,
            func.sum(d.attempts),
            func.sum(d.succeeded),
            func.sum(d.failed),
            func.sum(d.input_tokens),
            func.sum(d.output_tokens),
            func.sum(d.cost_micro),
            func.sum(d.unknown_cost),
            func.sum(d.cache_write_tokens),
            func.sum(d.cache_read_tokens),
        )
        .group_by(d.day)
        .order_by(d.day.desc())
        .limit(days)
    ).all()
    return [DayTotal(str(row[0]), *(int(v or 0) for v in row[1:])) for row in rows]


GATEWAY_ONE_OFF = "gateway_one_off"
"""The count of gateway requests' own sources (no `X-Ledger-Source`), kept out of `queued`."""


def source_counts(conn: Connection) -> dict[str, int]:
    """Sources by state (every state present, zero when none), the gateway's one-off sources
    counted apart as `gateway_one_off`, not as `queued`: they are no queue work."""

    s = sources.c
    # one index range count per state (`in_queue IN (0, 1)` lets the claim index serve it)
    counts = {
        state.value: int(
            conn.execute(
                select(func.count())
                .select_from(sources)
                .where(s.in_queue.in_([False, True]), s.state == state.value)
            ).scalar_one()
        )
        for state in SourceState
    }
    one_off = int(
        conn.execute(select(func.count()).select_from(sources).where(gateway_one_off()))
        .scalar_one()
    )
    counts[SourceState.QUEUED.value] -= one_off
    counts[GATEWAY_ONE_OFF] = one_off
    return counts


def source_summaries(
    conn: Connection, now: int, limit: int = SOURCE_LIST_LIMIT
) -> list[SourceSummary]:
    """The most relevant sources: leased, paused, queued, then done ones active in the last 24 h
    (the gateway's one-off sources are no queued work: counted, not listed)."""

    rows: list[Any] = []
    s = sources.c
    for state in _STATE_ORDER:
        if len(rows) >= limit:
            break
        # `in_queue IN (0, 1)` lets the claim index serve the state lookup
        where = and_(s.in_queue.in_([False, True]), s.state == state.value)
        if state is SourceState.QUEUED:
            where = and_(where, ~gateway_one_off())
        rows += conn.execute(
            select(sources)
            .where(where)
            .order_by(s.last_checked_ms.desc(), s.id)
            .limit(limit - len(rows))
        ).all()
    if len(rows) < limit:
        recent_ids = select(reservations.c.source_id).where(
            reservations.c.created_ms > now - DAY_MS
        )
        rows += conn.execute(
            select(sources)
            .where(s.state == SourceState.DONE.value, s.id.in_(recent_ids))
            .order_by(s.finished_ms.desc(), s.id)
            .limit(limit - len(rows))
        ).all()
    ids = [row.id for row in rows]
    counters = _source_counters(conn, ids)
    models = _source_models(conn, ids)
    out: list[SourceSummary] = []
    for row in rows:
        calls, used, allowance = counters.get(row.id, (0, 0, 0))
        out.append(
            SourceSummary(
                id=row.id,
                state=row.state,
                calls=calls + int(row.archived_calls),
                models=tuple(sorted(models.get(row.id, ()))),
                failures=int(row.failures),
                output_failures=int(row.output_failures),
                time_used_ms=used + int(row.archived_time_ms),
                pause_reason=row.pause_reason,
                retry_at_ms=row.retry_at_ms,
                lease_expires_ms=row.lease_expires_ms,
                open_allowance_ms=allowance,
            )
        )
    return out


def _source_counters(conn: Connection, ids: list[str]) -> dict[str, tuple[int, int, int]]:
    """Calls, time used and the part of it that is the whole allowance of reservations not
    settled (open or expired, counted conservatively as R-RES-8 says), per source."""
    if not ids:
        return {}
    r = reservations.c
    unsettled = r.status.in_(reads.OPEN_LIKE)
    allowance = case((unsettled, r.deadline_ms - r.created_ms), else_=0)
    used = case((unsettled, r.deadline_ms - r.created_ms), else_=func.coalesce(r.duration_ms, 0))
    rows = conn.execute(
        select(
            r.source_id,
            func.count(),
            func.coalesce(func.sum(used), 0),
            func.coalesce(func.sum(allowance), 0),
        )
        .where(r.source_id.in_(ids))
        .group_by(r.source_id)
    ).all()
    return {str(sid): (int(n), int(t), int(a)) for sid, n, t, a in rows}


def _source_models(conn: Connection, ids: list[str]) -> dict[str, list[str]]:
    if not ids:
        return {}
    out: dict[str, list[str]] = {}
    for sid, key in conn.execute(
        select(source_models.c.source_id, source_models.c.model_key).where(
            source_models.c.source_id.in_(ids)
        )
    ).all():
        out.setdefault(str(sid), []).append(str(key))
    return out


def _shown_status(status: str, deadline_ms: int, now: int) -> str:
    """An open reservation past its deadline is shown as what the next write makes it: expired."""
    return "expired" if status == "open" and deadline_ms <= now else status


def recent_attempts(conn: Connection, now: int, limit: int = RECENT_LIMIT) -> list[AttemptRow]:
    """The newest attempts, newest first (read in index order, stopped by the LIMIT)."""
    r = reservations.c
    rows = conn.execute(
        select(
            r.id,
            r.created_ms,
            r.source_id,
            r.model_key,
            r.provider,
            r.role,
            r.status,
            r.kind,
            r.subkind,
            r.duration_ms,
            r.late,
            r.deadline_ms,
        )
        .order_by(r.created_ms.desc(), r.id.desc())
        .limit(limit)
    ).all()
    return [
        AttemptRow(
            id=int(row.id),
            created_ms=int(row.created_ms),
            source_id=str(row.source_id),
            model_key=str(row.model_key),
            provider=str(row.provider),
            role=str(row.role),
            status=_shown_status(str(row.status), int(row.deadline_ms), now),
            kind=row.kind,
            subkind=row.subkind,
            duration_ms=None if row.duration_ms is None else int(row.duration_ms),
            late=bool(row.late),
        )
        for row in rows
    ]


def model_outcomes(conn: Connection, now: int) -> list[ModelOutcome]:
    """Attempts per (model, status, kind) in the rolling 24 h window."""
    r = reservations.c
    rows = conn.execute(
        select(r.provider, r.model_key, r.status, r.kind, func.count())
        .where(r.created_ms > now - DAY_MS)
        .group_by(r.provider, r.model_key, r.status, r.kind)
        .order_by(r.model_key, r.status, r.kind)
    ).all()
    return [ModelOutcome(str(p), str(m), str(s), k, int(n)) for p, m, s, k, n in rows]


def recent_notices(conn: Connection, limit: int = NOTICE_LIMIT) -> list[NoticeRow]:
    """The most recently seen deduplicated notices."""
    n = notices.c
    rows = conn.execute(
        select(n.category, n.message, n.source_id, n.first_ms, n.last_ms, n.count)
        .order_by(n.last_ms.desc(), n.id.desc())
        .limit(limit)
    ).all()
    return [NoticeRow(str(c), str(m), s, int(f), int(last), int(k)) for c, m, s, f, last, k in rows]


def hour_outcomes(conn: Connection, now: int) -> list[HourOutcome]:
    """Attempts per hour of the rolling 24 h window and (status, kind), with their cost (read
    through the created_ms index; the hours partition the window the daily totals count)."""
    r = reservations.c
    start = now - DAY_MS
    hour = ((r.created_ms - (start + 1)) // HOUR_MS).label("hour")  # created_ms in (start, now]
    rows = conn.execute(
        select(
            hour,
            r.status,
            r.kind,
            func.count(),
            func.coalesce(func.sum(r.cost_micro), 0),
            func.coalesce(func.sum(case((r.cost_micro.is_(None), 1), else_=0)), 0),
        )
        .where(r.created_ms > start)
        .group_by(hour, r.status, r.kind)
        .order_by(hour, r.status, r.kind)
    ).all()
    return [
        HourOutcome(
            # a row dated after `now` (another host's clock ahead) is counted in the last hour
            min(HOURS - 1, int(h)),
            str(status),
            kind,
            int(n),
            int(cost),
            int(unknown),
        )
        for h, status, kind, n, cost, unknown in rows
    ]


def recent_failovers(conn: Connection, now: int, limit: int = FAILOVER_LIMIT) -> list[FailoverRow]:
    """The newest fallback attempts of the last 24 h, each with the kind of the failure it
    follows (R-DIAG-5), newest first."""
    r = reservations.c
    before = reservations.alias("before")
    b = before.c
    # the failure it follows: the one it names (an immediate follow-up), else the newest failed
    # attempt of the source on the model it left (an owed fallback made by a later queue item)
    named = select(b.kind).where(b.id == r.after_id).scalar_subquery()
    newest_failed = (
        select(b.kind)
        .where(
            b.source_id == r.source_id,
            b.status == "failed",
            b.model_key == r.fallback_from,
            b.created_ms <= r.created_ms,
        )
        .order_by(b.created_ms.desc(), b.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    cause = func.coalesce(named, newest_failed)
    rows = conn.execute(
        select(r.created_ms, r.source_id, r.fallback_from, r.model_key, cause, r.status)
        .where(r.created_ms > now - DAY_MS, r.role == AttemptRole.FALLBACK.value)
        .order_by(r.created_ms.desc(), r.id.desc())
        .limit(limit)
    ).all()
    return [
        FailoverRow(int(t), str(sid), src, str(dst), kind, str(status))
        for t, sid, src, dst, kind, status in rows
    ]
