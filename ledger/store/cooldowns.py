"""Cooldown rows: upserted so a cooldown never shortens (R-POL-2); operators clear manual ones."""

from __future__ import annotations

from sqlalchemy import Connection, delete, insert, select, update

from ledger.kinds import CooldownOrigin, CooldownScope
from ledger.store.schema import cooldowns


def upsert_cooldown(
    conn: Connection,
    now: int,
    scope: CooldownScope,
    target: str,
    until_ms: int,
    kind: str,
    origin: CooldownOrigin,
    reason: str | None = None,
) -> int:
    """Set a cooldown to max(existing, new) per (scope, target, origin); returns its end."""
    key = (
        cooldowns.c.scope == scope.value,
        cooldowns.c.target == target,
        cooldowns.c.origin == origin.value,
    )
    existing = conn.execute(select(cooldowns.c.until_ms).where(*key)).scalar()
    if existing is None:
        conn.execute(
            insert(cooldowns).values(
                scope=scope.value,
                target=target,
                origin=origin.value,
                until_ms=until_ms,
                kind=kind,
                reason=reason,
                created_ms=now,
            )
        )
        return until_ms
    if existing <= now:  # an expired row is replaced outright
        conn.execute(
            update(cooldowns)
            .where(*key)
            .values(until_ms=until_ms, kind=kind, reason=reason, created_ms=now)
        )
        return until_ms
    # a given reason replaces the stored note (the end is still never shortened)
    note = {} if reason is None else {"reason": reason}
    if until_ms > existing:
        conn.execute(update(cooldowns).where(*key).values(until_ms=until_ms, kind=kind, **note))
        return until_ms
    if note:
        conn.execute(update(cooldowns).where(*key).values(**note))
    return int(existing)


def clear_cooldowns(
    conn: Connection, scope: CooldownScope, target: str, origins: tuple[CooldownOrigin, ...]
) -> int:
    """Delete cooldowns on a target with the given origins; returns how many were removed."""
    result = conn.execute(
        delete(cooldowns).where(
            cooldowns.c.scope == scope.value,
            cooldowns.c.target == target,
            cooldowns.c.origin.in_([o.value for o in origins]),
        )
    )
    return int(result.rowcount or 0)
