"""Learned limits (R-TOK-4): the token limits a provider reports on its answers, parsed.

Pure: headers and `now_ms` in, `LearnedLimits` (or None) out. Only numbers, durations and RFC 3339
timestamps are read, with the bounded parsers of ledger.classify (the ones that read Retry-After
and reset metadata); any other value is ignored, never guessed, never an exception. The store
keeps each reading per (provider, upstream model id) and kind until its reset
(ledger/store/learned.py); a reserve on that key is refused `provider_tokens_exhausted` when its
estimate does not fit what is left of it (ledger/budgets/learned.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ledger.classify import parse_duration_ms, parse_timestamp_ms
from ledger.clock import DAY_MS
from ledger.errors import UsageError

MAX_REMAINING = 10**12
"""The largest remaining or limit read (a larger value is garbage, ignored)."""
HORIZON_MS = DAY_MS
"""A reset further away than this is ignored: a provider's token windows reset within a minute
(a day at most), and a reading blocks its model until its reset."""

_COUNT = re.compile(r"[0-9]{1,13}")


class LimitKind(StrEnum):
    """Which tokens a reported limit counts (the names of ledger.budgets.unit's token measures)."""

    TOKENS = "tokens"  # input and output together (OpenAI's; Anthropic's most restrictive)
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"


_PARTS = ("limit", "remaining", "reset")
# (kind, its limit, remaining and reset header names), in the order they are read
_HEADERS: tuple[tuple[LimitKind, tuple[str, ...]], ...] = tuple(
    (kind, tuple(name.format(part) for part in _PARTS))
    for kind, name in (
        (LimitKind.TOKENS, "x-ratelimit-{}-tokens"),  # OpenAI
        (LimitKind.TOKENS, "anthropic-ratelimit-tokens-{}"),
        (LimitKind.INPUT_TOKENS, "anthropic-ratelimit-input-tokens-{}"),
        (LimitKind.OUTPUT_TOKENS, "anthropic-ratelimit-output-tokens-{}"),
    )
)
NAMES = frozenset(name for _, names in _HEADERS for name in names)
"""Every header read here (lower case)."""


def _plausible(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REMAINING


@dataclass(frozen=True)
class LearnedLimit:
    """One kind of a provider's token limit as it reported it: what is left until `reset_at_ms`
    (and the limit itself when it said)."""

    kind: LimitKind
    remaining: int
    reset_at_ms: int
    limit: int | None = None


@dataclass(frozen=True)
class LearnedLimits:
    """Every token limit one answer reported, read at `read_at_ms` (ledger time)."""

    read_at_ms: int
    limits: tuple[LearnedLimit, ...]

    def __post_init__(self) -> None:
        """Only plausible readings (the service takes them from callers too): counts in
        0..MAX_REMAINING, each kind once, a reset after the reading and within HORIZON_MS."""
        at = self.read_at_ms
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= 2**62:
            raise UsageError("read_at_ms must be int milliseconds")
        kinds = [getattr(x, "kind", None) for x in self.limits]
        if not self.limits or len(set(kinds)) != len(kinds):
            raise UsageError("learned limits need each kind at most once")
        for one in self.limits:
            if not isinstance(one, LearnedLimit) or not isinstance(one.kind, LimitKind):
                raise UsageError("learned limits must be LearnedLimit values")
            if not _plausible(one.remaining) or not (one.limit is None or _plausible(one.limit)):
                raise UsageError(f"a learned limit counts 0 to {MAX_REMAINING} tokens")
            reset = one.reset_at_ms
            if isinstance(reset, bool) or not isinstance(reset, int):
                raise UsageError("reset_at_ms must be int milliseconds")
            if not at < reset <= at + HORIZON_MS:
                raise UsageError("a learned limit resets after it was read, within a day")

    def to_json(self) -> dict[str, Any]:
        """The wire shape (`/v1/settle`'s outcome `limits`)."""
        return {
            "read_at_ms": self.read_at_ms,
            "limits": [
                {"kind": x.kind.value, "remaining": x.remaining, "reset_at_ms": x.reset_at_ms,
                 "limit": x.limit}
                for x in self.limits
            ],
        }  # fmt: skip


def read_limits(headers: Mapping[str, str], now_ms: int) -> LearnedLimits | None:
    """The token limits an answer's headers report (names in any case; one read repeated with
    two values is garbage), read at `now_ms`; None when none is usable.

    A kind counts only with both a remaining count and a reset (a duration such as `6m0s`,
    `20s`, `1.5s`, `120ms`, or an RFC 3339 time) in (now, now + HORIZON_MS]; a remaining above the
    reported limit is garbage. Two families reporting one kind: the smaller remaining wins."""
    try:
        view: dict[str, str | None] = {}
        for name, value in headers.items():
            key = name.lower()
            if key in NAMES:  # one name twice with two values is ambiguous: neither is read
                view[key] = value if view.get(key, value) == value else None
        if not view:
            return None
        found: dict[LimitKind, LearnedLimit] = {}
        for kind, names in _HEADERS:
            one = _one(view, kind, names, now_ms)
            if one is not None and (kind not in found or one.remaining < found[kind].remaining):
                found[kind] = one
    except Exception:  # a hostile mapping never breaks a call: nothing is learned from it
        return None
    if not found:
        return None
    return LearnedLimits(now_ms, tuple(found[k] for k in LimitKind if k in found))


def _one(
    headers: Mapping[str, str | None], kind: LimitKind, names: tuple[str, ...], now_ms: int
) -> LearnedLimit | None:
    limit_name, remaining_name, reset_name = names
    remaining = _count(headers.get(remaining_name))
    if remaining is None:
        return None
    reset = _reset(headers.get(reset_name), now_ms)
    if reset is None:
        return None
    limit = _count(headers.get(limit_name))
    if limit is not None and remaining > limit:
        return None
    return LearnedLimit(kind, remaining, reset, limit)


def _count(value: object) -> int | None:
    """A whole non-negative count up to MAX_REMAINING; None for anything else."""
    if not isinstance(value, str) or len(value) > 32:
        return None
    text = value.strip(" \t")
    if not _COUNT.fullmatch(text):
        return None
    count = int(text)
    return count if count <= MAX_REMAINING else None


def _reset(value: object, now_ms: int) -> int | None:
    """When a limit resets: a duration from now or an RFC 3339 time, in (now, now + horizon]."""
    if not isinstance(value, str):
        return None
    delta = parse_duration_ms(value)
    at = now_ms + delta if delta is not None else parse_timestamp_ms(value)
    if at is None or not now_ms < at <= now_ms + HORIZON_MS:
        return None
    return at

