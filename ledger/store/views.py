"""Read-only views for select, status and history: short deferred read transactions, no writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Connection, bindparam, func, select

from ledger.budgets.checks import DAY_MS, DailyWindow
from ledger.clock import iso
from ledger.config import Policy
from ledger.kinds import CooldownOrigin, CooldownScope
from ledger.routing.room import NOTHING_READ, TokenRoom
from ledger.store import probes, reads
from ledger.store.engine import Database
from ledger.store.schema import cooldowns, reservations, source_models, sources
from ledger.store.token_views import token_room


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
            "reason": self.reason,
        }

    def clear_command(self) -> str:
        """The command that removes this cooldown (policy and hint ones need --force)."""
        force = "" if self.origin == CooldownOrigin.MANUAL else " --force"
        return f"ledger cooldown clear {self.target}{force}"


@dataclass(frozen=True)
class CooldownChange:
    """What `cooldown set` / `clear` did, and every cooldown that still refuses the target.

    `blocking` is longest first (its first row is the cooldown in force); a model is also
    refused by a cooldown on its provider.
    """

    now_ms: int
    scope: CooldownScope
    target: str
    blocking: tuple[CooldownRow, ...]
    manual_until_ms: int | None = None  # set: the manual row's end (never shortened, R-POL-2)
    removed: int = 0  # clear: rows removed

    @property
    def in_force(self) -> CooldownRow | None:
        """The cooldown that ends last, if any still refuses the target."""
        return self.blocking[0] if self.blocking else None

    def manual_row(self) -> CooldownRow | None:
        """The manual cooldown on the target itself, if one is active."""
        return next(
            (
                c
                for c in self.blocking
                if c.origin == CooldownOrigin.MANUAL
                and (c.scope, c.target) == (self.scope, self.target)
            ),
            None,
        )


# Built once (a prebuilt statement goes straight to SQLAlchemy's compiled cache); the columns are
# named so rows unpack by position, and enum values map through dicts instead of Enum.__call__.
_ACTIVE_COOLDOWNS = (
    select(
        cooldowns.c.scope,
        cooldowns.c.target,
        cooldowns.c.until_ms,
        cooldowns.c.kind,
        cooldowns.c.origin,
        cooldowns.c.reason,
    )
    .where(cooldowns.c.until_ms > bindparam("now"))
    .order_by(cooldowns.c.until_ms, cooldowns.c.scope, cooldowns.c.target)
)
# Selection reads only scope, target and end of the active cooldowns (it keeps the latest end per
# target itself), in any order: three columns off the until_ms index, no sort.
_COOLDOWN_ENDS = select(cooldowns.c.scope, cooldowns.c.target, cooldowns.c.until_ms).where(
    cooldowns.c.until_ms > bindparam("now")
)
# The models a source has used (R-RES-7): all selection needs of the source, in one indexed read.
_SOURCE_MODELS = select(source_models.c.model_key).where(
    source_models.c.source_id == bindparam("source_id")
)
_SCOPES = {s.value: s for s in CooldownScope}
_ORIGINS = {o.value: o for o in CooldownOrigin}


def active_cooldowns(conn: Connection, now: int) -> list[CooldownRow]:
    """Every cooldown that has not ended, soonest end first."""
    rows = conn.execute(_ACTIVE_COOLDOWNS, {"now": now}).all()
    scopes, origins = _SCOPES, _ORIGINS
    return [
        CooldownRow(
            scopes.get(scope) or CooldownScope(scope),  # an unknown value raises as before
            target,
            int(until_ms),
            kind,
            origins.get(origin) or CooldownOrigin(origin),
            reason,
        )
        for scope, target, until_ms, kind, origin, reason in rows
    ]


def blocking_cooldowns(
    conn: Connection, now: int, scope: CooldownScope, target: str
) -> tuple[CooldownRow, ...]:
    """Active cooldowns that refuse `target` (for a model, its provider's too), longest first."""
    covered = {(scope, target)}
    if scope == CooldownScope.MODEL:
        covered.add((CooldownScope.PROVIDER, target.partition("/")[0]))
    rows = [c for c in active_cooldowns(conn, now) if (c.scope, c.target) in covered]
    return tuple(sorted(rows, key=lambda c: -c.until_ms))


class CooldownEnd(NamedTuple):
    """One active cooldown as selection reads it: scope, target, end."""

    scope: CooldownScope
    target: str
    until_ms: int


@dataclass(frozen=True)
class SelectState:
    """What selection reads from the ledger (one read transaction)."""

    now_ms: int
    cooldowns: tuple[CooldownEnd, ...]  # every active cooldown, in no particular order
    source_models: frozenset[str]
    hourly_next_free_ms: int | None
    daily: DailyWindow | None = None
    probing: tuple[CooldownEnd, ...] = ()  # recovery probes in flight, until their deadline
    tokens: TokenRoom = NOTHING_READ  # token windows and learned limits (R-TOK-4)


def select_state(
    db: Database,
    source_id: str | None,
    calls_per_hour: int,
    ceiling_micro: int | None = None,
    need_micro: int | None = None,
    policy: Policy | None = None,
    input_tokens: int = 0,
) -> SelectState:
    """Cooldowns, the source's models, the shared hourly budget and (under a cost ceiling) the
    rolling 24 h cost, in one read transaction; `need_micro`: see `reads.daily_window`. With
    `policy`, the token room of a request of `input_tokens` too (`token_views.token_room`)."""
    with db.read() as conn:
        now = db.read_now(conn)
        used = (
            frozenset(conn.execute(_SOURCE_MODELS, {"source_id": source_id}).scalars())
            if source_id
            else frozenset()
        )
        _, next_free = reads.hourly_usage(conn, now, calls_per_hour)
        rows = conn.execute(_COOLDOWN_ENDS, {"now": now}).all()
        daily = (
            None
            if ceiling_micro is None
            else reads.daily_window(conn, now, ceiling_micro, need_micro)
        )
        in_flight = probes.in_flight(conn, now)
        tokens = NOTHING_READ if policy is None else token_room(conn, now, policy, input_tokens)
    scopes = _SCOPES
    return SelectState(
        now_ms=now,
        cooldowns=tuple(
            [
                CooldownEnd(scopes.get(scope) or CooldownScope(scope), target, int(until_ms))
                for scope, target, until_ms in rows
            ]
        ),
        source_models=used,
        hourly_next_free_ms=next_free,
        daily=daily,
        probing=tuple(CooldownEnd(scope, target, until) for scope, target, until in in_flight),
        tokens=tokens,
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
            # the part of time used that unsettled reservations count with their whole allowance
            "open_allowance": [
                a.deadline_ms - a.created_ms for a in attempts if a.status in reads.OPEN_LIKE
            ],
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


def policy_writers(conn: Connection, now: int) -> list[tuple[str, int, int, int]]:
    """Policy fingerprints stamped on reservations in the last 24 h: (fp, last seen, count, first
    seen)."""
    rows = conn.execute(
        select(
            reservations.c.policy_fp,
            func.max(reservations.c.created_ms),
            func.count(),
            func.min(reservations.c.created_ms),
        )
        .where(reservations.c.created_ms > now - DAY_MS)
        .group_by(reservations.c.policy_fp)
    ).all()
    return [(str(fp), int(last), int(n), int(first)) for fp, last, n, first in rows]
