"""History reads for `ledger trace export` and the simulator's report (SPEC section 17, R-SIM-2).

Invariant: one short read transaction per call, no writes; only facts the ledger already keeps
(times, model keys, roles, kinds, subkinds, durations, tokens, costs, cooldown rows) are read —
never a payload reference, never text. Works on SQLite and PostgreSQL alike (SQLAlchemy Core).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, or_, select

from ledger.kinds import CooldownOrigin
from ledger.store.engine import Database
from ledger.store.schema import cooldowns, reservations, sources


@dataclass(frozen=True)
class AttemptRow:
    """One reservation as history: when, for whom, on what, and how it ended."""

    created_ms: int
    source_id: str
    model: str
    provider: str
    role: str
    fallback_from: str | None
    status: str
    kind: str | None
    subkind: str | None
    reason: str | None
    late: bool
    duration_ms: int | None
    settled_ms: int | None
    input_tokens: int | None
    output_tokens: int | None
    actual_micro: int | None
    cost_micro: int | None
    input_bytes: int
    hint_until_ms: int | None
    """The end of the cooldown a provider hint (Retry-After / reset) set when this attempt
    settled, when that cooldown row is still stored (the newest per target is kept)."""


@dataclass(frozen=True)
class ArrivalRow:
    """One source's first appearance in the ledger."""

    created_ms: int
    source_id: str
    state: str
    finished_ms: int | None


@dataclass(frozen=True)
class CooldownBand:
    """One stored cooldown row: what cooled, from when until when, and why."""

    scope: str
    target: str
    origin: str
    kind: str
    created_ms: int
    until_ms: int


@dataclass(frozen=True)
class History:
    """Attempts created after `since_ms`, the sources they concern, and stored cooldowns."""

    now_ms: int
    since_ms: int
    attempts: tuple[AttemptRow, ...]
    arrivals: tuple[ArrivalRow, ...]
    cooldowns: tuple[CooldownBand, ...]


_ATTEMPTS = (
    select(
        reservations.c.created_ms,
        reservations.c.source_id,
        reservations.c.model_key,
        reservations.c.provider,
        reservations.c.role,
        reservations.c.fallback_from,
        reservations.c.status,
        reservations.c.kind,
        reservations.c.subkind,
        reservations.c.reason,
        reservations.c.late,
        reservations.c.duration_ms,
        reservations.c.settled_ms,
        reservations.c.input_tokens,
        reservations.c.output_tokens,
        reservations.c.actual_micro,
        reservations.c.cost_micro,
        reservations.c.input_bytes,
    )
    .order_by(reservations.c.created_ms, reservations.c.id)
)


def read_history(db: Database, window_ms: int | None = None) -> History:
    """Attempts created in the last `window_ms` of ledger time (all when None), the sources they
    concern or that arrived meanwhile, and the stored cooldown rows."""
    with db.read() as conn:
        now = db.read_now(conn)
        since = -1 if window_ms is None else now - window_ms
        bands = _cooldown_bands(conn)
        hints = {
            (band.target, band.created_ms): band.until_ms
            for band in bands
            if band.origin == CooldownOrigin.HINT.value
        }
        attempts = tuple(
            _attempt(row, hints)
            for row in conn.execute(_ATTEMPTS.where(reservations.c.created_ms > since))
        )
        touched = {a.source_id for a in attempts}
        rows = conn.execute(
            select(sources.c.id, sources.c.created_ms, sources.c.state, sources.c.finished_ms)
            .where(or_(sources.c.created_ms > since, sources.c.id.in_(touched)))
            .order_by(sources.c.created_ms, sources.c.id)
        ).all()
    arrivals = tuple(
        ArrivalRow(int(created), str(sid), str(state), None if fin is None else int(fin))
        for sid, created, state, fin in rows
    )
    return History(now, since, attempts, arrivals, bands)


def _attempt(row: Sequence[Any], hints: dict[tuple[str, int], int]) -> AttemptRow:
    (created, source, model, provider, role, fallback_from, status, kind, subkind, reason, late,
     duration, settled, tin, tout, actual, cost, size) = tuple(row)
    hint = None
    if settled is not None:
        hint = hints.get((str(model), int(settled))) or hints.get((str(provider), int(settled)))
    return AttemptRow(
        created_ms=int(created),
        source_id=str(source),
        model=str(model),
        provider=str(provider),
        role=str(role),
        fallback_from=fallback_from,
        status=str(status),
        kind=kind,
        subkind=subkind,
        reason=reason,
        late=bool(late),
        duration_ms=None if duration is None else int(duration),
        settled_ms=None if settled is None else int(settled),
        input_tokens=None if tin is None else int(tin),
        output_tokens=None if tout is None else int(tout),
        actual_micro=None if actual is None else int(actual),
        cost_micro=None if cost is None else int(cost),
        input_bytes=int(size),
        hint_until_ms=hint,
    )


def _cooldown_bands(conn: Connection) -> tuple[CooldownBand, ...]:
    rows = conn.execute(
        select(
            cooldowns.c.scope,
            cooldowns.c.target,
            cooldowns.c.origin,
            cooldowns.c.kind,
            cooldowns.c.created_ms,
            cooldowns.c.until_ms,
        ).order_by(cooldowns.c.created_ms, cooldowns.c.scope, cooldowns.c.target)
    ).all()
    return tuple(
        CooldownBand(str(s), str(t), str(o), str(k), int(c), int(u)) for s, t, o, k, c, u in rows
    )


def active_cooldown_bands(db: Database) -> tuple[int, tuple[CooldownBand, ...]]:
    """Ledger time now and every cooldown row that has not ended (for the simulator's bands)."""
    with db.read() as conn:
        now = db.read_now(conn)
        bands = tuple(b for b in _cooldown_bands(conn) if b.until_ms > now)
    return now, bands
