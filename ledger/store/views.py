"""Read-only views for select, status and history: short deferred read transactions, no writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select

from ledger.budgets import DAY_MS
from ledger.clock import iso
from ledger.kinds import CooldownOrigin, CooldownScope
from ledger.store import reads
from ledger.store.engine import Database
from ledger.store.schema import cooldowns, meta, reservations, sources


@dataclass(frozen=True)
class CooldownRow:
    """An active cooldown as stored."""

    scope: CooldownScope
    target: str
    until_ms: int
    kind: str
    origin: CooldownOrigin
    reason: str | None

    def to_json(self, now: int) -> dict[str, Any]:
        """The JSON shape shared by `cooldown list` and `status`."""
        return {
            "scope": self.scope.value,
            "target": self.target,
            "until": iso(self.until_ms),
            "remaining_s": round((self.until_ms - now) / 1000, 3),
            "kind": self.kind,
            "origin": self.origin.value,
        }


def active_cooldowns(conn: Connection, now: int) -> list[CooldownRow]:
    """Every cooldown that has not ended, soonest end first."""
    rows = conn.execute(
        select(cooldowns)
        .where(cooldowns.c.until_ms > now)
        .order_by(cooldowns.c.until_ms, cooldowns.c.scope, cooldowns.c.target)
    )
    return [
        CooldownRow(
            CooldownScope(r.scope),
            r.target,
            int(r.until_ms),
            r.kind,
            CooldownOrigin(r.origin),
            r.reason,
        )
        for r in rows
    ]


@dataclass(frozen=True)
class SelectState:
    """What selection reads from the ledger (one read transaction)."""

    now_ms: int
    cooldowns: list[CooldownRow]
    source_models: frozenset[str]
    hourly_next_free_ms: int | None


def select_state(db: Database, source_id: str | None, calls_per_hour: int) -> SelectState:
    """Cooldowns, the source's models and the shared hourly budget, in one read transaction."""
    with db.read() as conn:
        now = db.read_now(conn)
        budget = reads.source_budget(conn, source_id) if source_id else None
        _, next_free = reads.hourly_usage(conn, now, calls_per_hour)
        return SelectState(
            now_ms=now,
            cooldowns=active_cooldowns(conn, now),
            source_models=budget.models if budget else frozenset(),
            hourly_next_free_ms=next_free,
        )


def cooldown_list(db: Database) -> tuple[int, list[CooldownRow]]:
    """Active cooldowns and the ledger time they were read at."""
    with db.read() as conn:
        now = db.read_now(conn)
        return now, active_cooldowns(conn, now)


def source_detail(db: Database, source_id: str) -> dict[str, Any] | None:
    """A source row, its counters and every attempt (R-DIAG-5), or None."""
    with db.read() as conn:
        now = db.read_now(conn)
        row = conn.execute(select(sources).where(sources.c.id == source_id)).first()
        if row is None:
            return None
        budget = reads.source_budget(conn, source_id)
        attempts = conn.execute(
            select(reservations)
            .where(reservations.c.source_id == source_id)
            .order_by(reservations.c.id)
        ).all()
        return {
            "now": now,
            "source": dict(row._mapping),
            "budget": budget,
            "attempts": [_with_expiry(dict(a._mapping), now) for a in attempts],
        }


def _with_expiry(attempt: dict[str, Any], now: int) -> dict[str, Any]:
    """An open reservation past its deadline is shown as expired (what the next write records)."""
    if attempt["status"] == "open" and attempt["deadline_ms"] <= now:
        attempt["status"] = "expired"
    return attempt


def source_rows(db: Database, limit: int = 1000) -> list[dict[str, Any]]:
    """Sources with their counters (newest first)."""
    with db.read() as conn:
        calls = (
            select(reservations.c.source_id, func.count().label("calls"))
            .group_by(reservations.c.source_id)
            .subquery()
        )
        rows = conn.execute(
            select(sources, func.coalesce(calls.c.calls, 0).label("calls"))
            .outerjoin(calls, calls.c.source_id == sources.c.id)
            .order_by(sources.c.created_ms.desc(), sources.c.id)
            .limit(limit)
        ).all()
        return [dict(r._mapping) for r in rows]


def meta_values(db: Database) -> dict[str, str]:
    """The meta table."""
    with db.read() as conn:
        return {r.key: r.value for r in conn.execute(select(meta))}


def policy_writers(conn: Connection, now: int) -> list[tuple[str, int, int]]:
    """Policy fingerprints stamped on reservations in the last 24 h: (fp, last seen, count)."""
    rows = conn.execute(
        select(
            reservations.c.policy_fp,
            func.max(reservations.c.created_ms),
            func.count(),
        )
        .where(reservations.c.created_ms > now - DAY_MS)
        .group_by(reservations.c.policy_fp)
    ).all()
    return [(str(fp), int(last), int(n)) for fp, last, n in rows]
