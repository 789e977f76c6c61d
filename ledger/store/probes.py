"""Recovery probes (R-POL-9, R-POL-10): used inside reserve's and settle's write transactions.

Invariant: a target (provider or model) has a `probes` row from the moment a policy or hint
cooldown is set on it until a probe claimed after that cooldown ended succeeds (or an operator
clears its cooldowns): every cooldown that ends arms its probe, also one set while an older probe
was in flight (a late failure of a call sent before the first cooldown). While the
row names a holder whose deadline has not passed, every other reservation on the target is refused
`probing`; the check and the claim run in the reserving write transaction, so exactly one probe is
granted fleet-wide. A holder that never settles frees the target at its deadline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    ScalarSelect,
    bindparam,
    case,
    delete,
    exists,
    insert,
    select,
    update,
)

from ledger.clock import HOUR_MS
from ledger.kinds import CooldownOrigin, CooldownScope, FailureKind
from ledger.store.notices import record_notice
from ledger.store.schema import cooldowns, probes, reservations

# Failures that prove the target answered: not provider health, so the probe succeeded.
ANSWERED = frozenset(
    {FailureKind.INVALID_OUTPUT, FailureKind.SAFETY, FailureKind.WRITE_REJECTED, FailureKind.STALE}
)


def probe_mark(scope: CooldownScope, target_param: str) -> ScalarSelect[Any]:
    """A column for reserve's one read of the shared state: NULL when the target (named by the
    bind parameter) has no probe row, -1 while it is armed with no holder, else its holder's
    deadline (`gate` tells armed from held)."""
    return (
        select(
            case(
                (
                    probes.c.holder_id.is_not(None) & probes.c.holder_deadline_ms.is_not(None),
                    probes.c.holder_deadline_ms,
                ),
                else_=-1,
            )
        )
        .where(probes.c.scope == scope.value, probes.c.target == bindparam(target_param))
        .scalar_subquery()
    )


HOLDS_A_PROBE = exists().where(
    probes.c.holder_id == reservations.c.id,
    probes.c.holder_deadline_ms == reservations.c.deadline_ms,
)
"""A column for a reservation's own read: whether it is a probe (`held_by` finds some target);
settle reads it with the row, so an ordinary settle spends no statement on probes."""
_HELD_BY = select(probes.c.scope, probes.c.target, probes.c.streak).where(
    probes.c.holder_id == bindparam("b_holder"),
    probes.c.holder_deadline_ms == bindparam("b_deadline"),
)
_IN_FLIGHT = select(probes.c.scope, probes.c.target, probes.c.holder_deadline_ms).where(
    probes.c.holder_id.is_not(None), probes.c.holder_deadline_ms > bindparam("now")
)
_ONE = (probes.c.scope == bindparam("b_scope")) & (probes.c.target == bindparam("b_target"))
# A policy or hint cooldown on the target that ends after the probe was claimed: it was set while
# the probe was in flight (at the claim every cooldown on the target had ended), so it needs a
# probe of its own.
_COOLED_SINCE = select(
    exists().where(
        cooldowns.c.scope == bindparam("b_scope"),
        cooldowns.c.target == bindparam("b_target"),
        cooldowns.c.origin.in_([CooldownOrigin.POLICY.value, CooldownOrigin.HINT.value]),
        cooldowns.c.until_ms > bindparam("b_claimed"),
    )
)


@dataclass(frozen=True)
class ProbeGate:
    """What reserve reads of the probes on a provider and a model."""

    armed: tuple[tuple[CooldownScope, str], ...]  # targets whose next reservation is the probe
    held_until: int | None  # another probe is in flight until then: refuse `probing`


def gate(
    provider: str, model_key: str, provider_mark: int | None, model_mark: int | None, now: int
) -> ProbeGate:
    """The armed targets among this provider and model and the end of a probe in flight, from
    their `probe_mark` columns."""
    armed: list[tuple[CooldownScope, str]] = []
    held: list[int] = []
    for scope, target, mark in (
        (CooldownScope.PROVIDER, provider, provider_mark),
        (CooldownScope.MODEL, model_key, model_mark),
    ):
        if mark is None:
            continue
        if int(mark) > now:
            held.append(int(mark))
        else:  # armed, or its holder's deadline passed: the next reservation is the probe
            armed.append((scope, target))
    return ProbeGate(tuple(armed), max(held) if held else None)


def claim(
    conn: Connection, targets: Iterable[tuple[CooldownScope, str]], holder: int, deadline: int
) -> None:
    """Make reservation `holder` the probe of each armed target until its deadline."""
    for scope, target in targets:
        conn.execute(
            update(probes).where(_ONE).values(holder_id=holder, holder_deadline_ms=deadline),
            {"b_scope": scope.value, "b_target": target},
        )


def held_by(conn: Connection, holder: int, deadline: int) -> dict[tuple[CooldownScope, str], int]:
    """The targets reservation `holder` is the probe of, with their failed-probe streaks."""
    rows = conn.execute(_HELD_BY, {"b_holder": holder, "b_deadline": deadline})
    return {(CooldownScope(scope), str(target)): int(streak) for scope, target, streak in rows}


def arm(conn: Connection, scope: CooldownScope, target: str) -> None:
    """A policy or hint cooldown was set on the target: it ends with a probe."""
    found = conn.execute(
        select(probes.c.streak).where(_ONE), {"b_scope": scope.value, "b_target": target}
    ).first()
    if found is None:
        conn.execute(insert(probes).values(scope=scope.value, target=target, streak=0))


def settle_probes(
    conn: Connection,
    now: int,
    held: Mapping[tuple[CooldownScope, str], int],
    kind: FailureKind | None,
    cooled: Iterable[tuple[CooldownScope, str]],
    claimed_ms: int,
) -> list[str]:
    """Apply a settled probe (reserved at `claimed_ms`) to the targets it held; returns the
    actions taken.

    `kind` None is a success. A success, or a failure that shows the target answered, ends
    probing and resets the streak, unless a cooldown set while the probe was in flight is still
    to end in a probe of its own: the target then stays armed (R-POL-9); a failure that cooled
    the target again counts one more failed probe (the cooldown was already doubled by the
    policy table); anything else (cancelled, a failure of another target) frees the probe slot
    for the next reservation.
    """
    cooled_now = set(cooled)
    actions: list[str] = []
    for (scope, target), streak in held.items():
        key = {"b_scope": scope.value, "b_target": target}
        if kind is None or kind in ANSWERED:
            if conn.execute(_COOLED_SINCE, {**key, "b_claimed": claimed_ms}).scalar():
                conn.execute(
                    update(probes)
                    .where(_ONE)
                    .values(streak=0, holder_id=None, holder_deadline_ms=None),
                    key,
                )
                message = f"recovery probe succeeded on {scope} {target}"
                actions.append(
                    _noticed(conn, now, message) + "; a newer cooldown ends in a probe of its own"
                )
                continue
            conn.execute(delete(probes).where(_ONE), key)
            actions.append(_noticed(conn, now, f"recovery probe succeeded on {scope} {target}"))
        elif (scope, target) in cooled_now:
            conn.execute(
                update(probes)
                .where(_ONE)
                .values(streak=streak + 1, holder_id=None, holder_deadline_ms=None),
                key,
            )
            actions.append(
                _noticed(conn, now, f"recovery probe failed on {scope} {target} ({kind})")
            )
        else:
            conn.execute(
                update(probes).where(_ONE).values(holder_id=None, holder_deadline_ms=None), key
            )
            actions.append(f"recovery probe inconclusive: {scope} {target} probes again")
    return actions


def _noticed(conn: Connection, now: int, message: str) -> str:
    """Record a probe outcome once per hour as a notice (R-DIAG-4); returns the message."""
    record_notice(conn, now, "probe", f"probe:{message}:{now // HOUR_MS}", message, None)
    return message


def disarm(conn: Connection, scope: CooldownScope, target: str) -> None:
    """An operator cleared the target's cooldowns: it ends without a probe (R-POL-9)."""
    conn.execute(delete(probes).where(_ONE), {"b_scope": scope.value, "b_target": target})


def in_flight(conn: Connection, now: int) -> list[tuple[CooldownScope, str, int]]:
    """Every probe in flight: (scope, target, its deadline), for selection."""
    return [
        (CooldownScope(scope), str(target), int(deadline))
        for scope, target, deadline in conn.execute(_IN_FLIGHT, {"now": now})
    ]
