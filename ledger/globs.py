"""Anchored globs over model keys (route rules R-SEL-9, chain keys R-RT-1): `*` any run (`/`
included), `?` exactly one character, everything else literal.

Invariant: matching time is polynomial in key and pattern length whatever the pattern (a policy
file must not be able to hang a worker with catastrophic regex backtracking). A leaf: it imports
nothing of the ledger, so route rules and chains both use it without importing each other.
"""

from __future__ import annotations

import re
from functools import lru_cache


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
