"""Route targets (R-RT-2): a model key, a pool key (`pool/NAME`), or a model key with an effort.

A `:LEVEL` suffix whose LEVEL is one of `EFFORT_LEVELS` means the same as an `effort` field; any
other suffix is part of the model id (`openrouter/fusion:xxs` stays as written). An effort belongs
to its route only: a route without one gets the provider's default, never the primary's effort.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

POOL_PROVIDER = "pool"
"""The reserved provider name of pool keys (`pool/NAME`, R-RT-4)."""
POOL_PREFIX = POOL_PROVIDER + "/"


class Effort(StrEnum):
    """The reasoning-effort levels a route may carry (R-RT-2)."""

    NONE = "none"
    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"
    MAX = "max"


EFFORT_LEVELS = tuple(e.value for e in Effort)


@dataclass(frozen=True, slots=True)
class Target:
    """One route target: `key` is a model key or a pool key; `effort` None means none asked."""

    key: str
    effort: Effort | None = None

    @property
    def is_pool(self) -> bool:
        """Whether this names a pool (`pool/NAME`)."""
        return self.key.startswith(POOL_PREFIX)

    @property
    def pool_name(self) -> str | None:
        """The pool's NAME, or None for a model key."""
        return self.key[len(POOL_PREFIX) :] if self.is_pool else None

    def __str__(self) -> str:
        return self.key if self.effort is None else f"{self.key}:{self.effort}"


def split_effort(text: str) -> tuple[str, Effort | None]:
    """`provider/model:high` -> (`provider/model`, high); an unlisted suffix stays in the key."""
    head, sep, tail = text.rpartition(":")
    if sep and head and tail in EFFORT_LEVELS and "/" in head:
        return head, Effort(tail)
    return text, None


def parse_target(text: str, effort: str | Effort | None = None) -> Target:
    """A target from a key (maybe with a `:LEVEL` suffix) and an optional explicit effort.

    An explicit effort and a suffix together are ambiguous: the explicit one must not also be
    given as a suffix (ValueError with a fixed rule text).
    """
    key, suffix = split_effort(text)
    if suffix is not None and effort is not None:
        raise ValueError("rule: give the effort either as `effort` or as a `:LEVEL` suffix")
    chosen = suffix if effort is None else Effort(effort)
    return Target(key, chosen)


def pool_key(name: str) -> str:
    """`pool/NAME`."""
    return POOL_PREFIX + name


def is_pool_key(key: str) -> bool:
    """Whether a key names a pool."""
    return key.startswith(POOL_PREFIX)
