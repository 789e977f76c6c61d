"""Read queries shared by store operations (used inside their transactions; no writes here)."""

from __future__ import annotations

from sqlalchemy import Connection, case, func, select

from ledger.budgets import DAY_MS, HOUR_MS, SourceBudget
from ledger.kinds import CooldownScope, SourceState
from ledger.store.schema import cooldowns, reservations, source_models, sources

OPEN_LIKE = ("open", "expired")


def hourly_usage(conn: Connection, now: int, limit: int) -> tuple[int, int | None]:
    """Reservations created in the last 3600 s, and when the next slot frees when full."""
    since = now - HOUR_MS
    count = conn.execute(
        select(func.count()).select_from(reservations).where(reservations.c.created_ms > since)
    ).scalar_one()
    if count < limit:
        return count, None
    oldest = conn.execute(
        select(reservations.c.created_ms)
        .where(reservations.c.created_ms > since)
        .order_by(reservations.c.created_ms)
        .limit(1)
        .offset(count - limit)
    ).scalar()
    return count, None if oldest is None else int(oldest) + HOUR_MS


def daily_cost(conn: Connection, now: int) -> tuple[int, int | None]:
    """Sum of cost (actual where known, else estimate) over the last 24 h, and the oldest + 24 h."""
    since = now - DAY_MS
    total, oldest = conn.execute(
        select(
            func.coalesce(func.sum(reservations.c.cost_micro), 0),
            func.min(reservations.c.created_ms),
        ).where(reservations.c.created_ms > since)
    ).one()
    return int(total), None if oldest is None else int(oldest) + DAY_MS


def source_budget(conn: Connection, source_id: str) -> SourceBudget | None:
    """A source's state and counters (archived history included), or None if it does not exist."""
    row = conn.execute(
        select(
            sources.c.state,
            sources.c.retry_at_ms,
            sources.c.archived_calls,
            sources.c.archived_time_ms,
        ).where(sources.c.id == source_id)
    ).one_or_none()
    if row is None:
        return None
    calls, used = conn.execute(
        select(
            func.count(),
            func.coalesce(
                func.sum(
                    case(
                        (
                            reservations.c.status.in_(OPEN_LIKE),
                            reservations.c.deadline_ms - reservations.c.created_ms,
                        ),
                        else_=func.coalesce(reservations.c.duration_ms, 0),
                    )
                ),
                0,
            ),
        ).where(reservations.c.source_id == source_id)
    ).one()
    models = conn.execute(
        select(source_models.c.model_key).where(source_models.c.source_id == source_id)
    ).scalars()
    return SourceBudget(
        state=SourceState(row.state),
        retry_at_ms=row.retry_at_ms,
        calls=int(calls) + int(row.archived_calls),
        models=frozenset(models),
        time_used_ms=int(used) + int(row.archived_time_ms),
    )


def cooldown_until(conn: Connection, scope: CooldownScope, target: str, now: int) -> int | None:
    """The latest end of any active cooldown on this target (all origins)."""
    value = conn.execute(
        select(func.max(cooldowns.c.until_ms)).where(
            cooldowns.c.scope == scope.value,
            cooldowns.c.target == target,
            cooldowns.c.until_ms > now,
        )
    ).scalar()
    return None if value is None else int(value)
