"""Scopes (R-SC-1): what one scope has in use (for status) and the names a caller gives.

A reservation under scopes is checked against each scope's `callsPerHour`, `dailyEstimatedUsd`
and `inFlight` exactly as the global budgets are (section 7): they are budgets of
`ledger.budgets.unit` (`scope_budgets`), checked in the reserving write transaction.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ledger.config import SCOPE_NAME, Policy
from ledger.errors import UsageError


@dataclass(frozen=True)
class ScopeUse:
    """What one scope has in use (status, R-SC-2).

    Only what the scope limits is read: an unlimited part is 0 / None.
    """

    name: str
    hourly_count: int = 0
    hourly_next_free_ms: int | None = None  # when full: its oldest counted reservation leaves
    daily_cost_micro: int = 0
    in_flight: int = 0
    in_flight_next_free_ms: int | None = None  # the earliest deadline of its open reservations


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
