"""Route rules over model keys (R-SEL-9): anchored globs; deny always wins; a non-empty allow admits
only what it matches. With R-SEL-3 and R-SEL-5 they form the privacy boundary that selection and
reserve both apply (`boundary_reason`).

The globs themselves are `ledger/globs.py` (polynomial matching whatever the pattern).
"""

from __future__ import annotations

from collections.abc import Iterable

from ledger.config import Policy, RouteRules
from ledger.globs import matches
from ledger.kinds import ExclusionReason
from ledger.routing.chains import allowlist, expand


def route_allowed(key: str, rules: RouteRules) -> bool:
    """Deny always wins; a non-empty allow list admits only what it matches (R-SEL-9)."""
    if any(matches(key, pattern) for pattern in rules.deny):
        return False
    return not rules.allow or any(matches(key, pattern) for pattern in rules.allow)


def confinement_reason(
    policy: Policy, key: str, primary: str | None, tried: Iterable[str] = ()
) -> ExclusionReason | None:
    """R-SEL-3, R-SEL-5 (with R-RT-1 chains) for a model that is not the source's primary.

    With `crossProviderFallback: false` a source is confined to its primary (a pool primary: to
    its candidates); the primary's chain, cascaded through the backups in `tried`, is the
    complete list of backups (`fallbackModels` is the default chain). None when `key` may be used.
    """
    if key == primary or (primary is not None and key in expand(policy, primary)):
        return None
    if not policy.cross_provider_fallback:
        return ExclusionReason.NOT_IN_FALLBACK_LIST
    allowed = allowlist(policy, primary, tried)
    if allowed is not None and key not in allowed:
        return ExclusionReason.NOT_IN_FALLBACK_LIST
    return None


def boundary_reason(
    policy: Policy, key: str, primary: str | None, tried: Iterable[str] = ()
) -> ExclusionReason | None:
    """The privacy boundary for one model (R-SEL-9, then R-SEL-3/R-SEL-5), as selection applies it.

    Reserve applies the same function, so a model that selection excludes for these reasons can
    never be reserved either, whatever the caller says about its role (override included).
    """
    if not route_allowed(key, policy.routes):
        return ExclusionReason.DENIED_BY_ROUTE
    return confinement_reason(policy, key, primary, tried)
