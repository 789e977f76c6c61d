"""Route rules over model keys (R-SEL-9): anchored globs; deny always wins; a non-empty allow admits
only what it matches. With R-SEL-3 and R-SEL-5 they form the privacy boundary that selection and
reserve both apply (`boundary_reason`).

Invariant: matching time is polynomial in key and pattern length whatever the pattern (a policy
file must not be able to hang a worker with catastrophic regex backtracking).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from ledger.config import Policy, RouteRules
from ledger.kinds import ExclusionReason


def _segment(text: str) -> str:
    """A star-free glob piece as regex: `?` is one character, everything else literal."""
    return "".join("." if ch == "?" else re.escape(ch) for ch in text)


@lru_cache(maxsize=4096)
def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Anchored regex for a glob: `*` any run (`/` included), `?` exactly one character."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return re.compile(rf"\A{_segment(pattern)}\Z", re.DOTALL)
    first, *middle, last = parts
    # Between two stars the earliest occurrence of a fixed-length piece is always a right choice
    # (whatever follows starts with `*`), so each middle piece is matched lazily inside an atomic
    # group: the engine never backtracks into it, which keeps `*a*a*a*…` patterns linear-ish.
    body = "".join(f"(?>.*?{_segment(piece)})" for piece in middle if piece)
    return re.compile(rf"\A{_segment(first)}{body}.*{_segment(last)}\Z", re.DOTALL)


def matches(key: str, pattern: str) -> bool:
    """Whether a model key matches one anchored glob."""
    return glob_to_regex(pattern).match(key) is not None


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
    from ledger.routing.chains import allowlist, expand

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
