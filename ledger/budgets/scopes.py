"""Scope budget arithmetic (R-SC-1): pure, takes `now`, gives a refusal or None.

A reservation under scopes is checked against each scope's `callsPerHour`, `dailyEstimatedUsd`
and `inFlight` exactly as the global budgets are (section 7): the store reads a `ScopeUse` per
scope inside the reserving write transaction, `check` decides, and the store inserts the
reservation with its scopes in that same transaction, so no two processes can both take a
scope's last slot.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from ledger.config import SCOPE_NAME, Policy, ScopeLimits
from ledger.errors import UsageError
from ledger.kinds import RefusalReason


@dataclass(frozen=True)
class ScopeUse:
    """What one scope has in use, read inside the reserving transaction.

    Only what the scope limits is read: an unlimited part is 0 / None.
    """

    name: str
    hourly_count: int = 0
    hourly_next_free_ms: int | None = None  # when full: its oldest counted reservation leaves
    daily_cost_micro: int = 0
    in_flight: int = 0
    in_flight_next_free_ms: int | None = None  # the earliest deadline of its open reservations


@dataclass(frozen=True)
class ScopeRefusal:
    """A refusal by one scope: its reason, the scope's name and, when known, when to retry."""

    reason: RefusalReason
    scope: str
    retry_at_ms: int | None = None


def ceiling_micro(limits: ScopeLimits) -> int | None:
    """A scope's `dailyEstimatedUsd` in whole micro-USD (rounded down: never exceeded)."""
    if limits.daily_estimated_usd is None:
        return None
    return math.floor(Decimal(str(limits.daily_estimated_usd)) * 1_000_000)


def check(
    uses: Iterable[ScopeUse], scopes: Mapping[str, ScopeLimits], estimate: int | None
) -> ScopeRefusal | None:
    """Each scope in turn (in the order given): the first over a limit refuses.

    Per scope, in the order of section 7: the hourly count, the daily cost (an unknown price
    fails closed when the scope has a ceiling), then the reservations open at once.
    """
    for use in uses:
        limits = scopes[use.name]
        if limits.calls_per_hour is not None and use.hourly_count >= limits.calls_per_hour:
            return ScopeRefusal(
                RefusalReason.SCOPE_HOURLY_BUDGET, use.name, use.hourly_next_free_ms
            )
        ceiling = ceiling_micro(limits)
        if ceiling is not None:
            if estimate is None:
                return ScopeRefusal(RefusalReason.UNKNOWN_PRICE, use.name)
            if use.daily_cost_micro + estimate > ceiling:
                # when room frees needs the scope's window rows: the store fills it in
                return ScopeRefusal(RefusalReason.SCOPE_DAILY_COST, use.name)
        if limits.in_flight is not None and use.in_flight >= limits.in_flight:
            return ScopeRefusal(
                RefusalReason.SCOPE_IN_FLIGHT, use.name, use.in_flight_next_free_ms
            )
    return None


def check_names(names: Iterable[object], policy: Policy) -> tuple[str, ...]:
    """Scope names a caller gave, checked against the policy: sorted, without duplicates.

    An unknown name is a usage error; it is named only when it is a well-formed scope name (a
    typo to find), never when it could be anything else (R-CFG-3: never echo a value).
    """
    if not isinstance(names, list | tuple | set | frozenset):
        raise UsageError("scopes must be a list of scope names")
    found: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise UsageError("a scope name must be text")
        if name not in policy.scopes:
            raise UsageError(unknown_scope_message(name))
        found.add(name)
    return tuple(sorted(found))


def unknown_scope_message(name: str) -> str:
    """`unknown scope NAME: not in recovery.json`, naming it only when it is a plain name."""
    if re.fullmatch(SCOPE_NAME, name):
        return f"unknown scope {name}: not in recovery.json's scopes"
    return "unknown scope (not shown: not a valid scope name): not in recovery.json's scopes"
