"""Conservative token estimates and context fit (R-SEL-8): never an exact count, never truncation.

Invariant: an estimate is one token per CJK character plus ⌈UTF-8 bytes of all other text / 3⌉;
evidence that cannot fit is rejected (`InputPlan.fits` is False), never cut to pretend it fits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ledger.catalog import Model

# Code points counted as one token each. Every one of them is at least 3 bytes in UTF-8 (all are
# ≥ U+0800), so ⌈bytes / 3⌉ bounds the estimate of any text of that size (see tokens_for_bytes).
# For the 3-byte (BMP) ranges the count equals what ⌈bytes / 3⌉ would give anyway; the rule makes a
# difference for the 4-byte ideographs and kana of the supplementary planes (1 token, not 4/3).
CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x2E80, 0x2FDF),  # CJK Radicals Supplement, Kangxi Radicals
    (0x2FF0, 0x2FFF),  # Ideographic Description Characters
    (0x3000, 0x303F),  # CJK Symbols and Punctuation
    (0x3040, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana
    (0x3100, 0x312F),  # Bopomofo
    (0x3130, 0x318F),  # Hangul Compatibility Jamo
    (0x3190, 0x31FF),  # Kanbun, Bopomofo Extended, CJK Strokes, Katakana Phonetic Extensions
    (0x3200, 0x33FF),  # Enclosed CJK Letters and Months, CJK Compatibility
    (0x3400, 0x4DBF),  # CJK Unified Ideographs Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xA960, 0xA97F),  # Hangul Jamo Extended-A
    (0xAC00, 0xD7AF),  # Hangul Syllables
    (0xD7B0, 0xD7FF),  # Hangul Jamo Extended-B
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0xFE30, 0xFE4F),  # CJK Compatibility Forms
    (0xFF00, 0xFFEF),  # Halfwidth and Fullwidth Forms
    (0x1AFF0, 0x1B16F),  # Kana Extended-B, Kana Supplement, Kana Extended-A, Small Kana Extension
    (0x20000, 0x3FFFF),  # Supplementary and Tertiary Ideographic Planes (Extensions B..I)
)

_CJK = re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in CJK_RANGES) + "]")


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def _utf8_len(text: str) -> int:
    # surrogatepass: a lone surrogate still costs its 3 bytes instead of raising
    return len(text.encode("utf-8", "surrogatepass"))


def estimate_tokens(text: str) -> int:
    """One token per CJK character plus ⌈UTF-8 bytes of the other characters / 3⌉ (R-SEL-8)."""
    other = _CJK.sub("", text)
    return (len(text) - len(other)) + _ceil_div(_utf8_len(other), 3)


def tokens_for_bytes(input_bytes: int) -> int:
    """Estimate when only a UTF-8 byte count is known: ⌈bytes / 3⌉.

    This is never below `estimate_tokens` of any text of that many bytes: a CJK character is at
    least 3 bytes and counts 1 token, other text counts 1 token per 3 bytes. (Cost estimates under
    R-RES-2 are more conservative still and use one token per byte; that is not this function.)
    """
    if input_bytes < 0:
        raise ValueError("input_bytes must not be negative")
    return _ceil_div(input_bytes, 3)


def fits(model: Model, input_tokens: int, reply_tokens: int) -> bool:
    """estimate <= contextWindow - min(maxOutputTokens, replyTokens); an unknown window fits."""
    if model.context_window is None:
        return True
    return input_tokens <= model.context_window - model.reply_reservation(reply_tokens)


@dataclass(frozen=True)
class InputPlan:
    """Which optional items (indices into the caller's priority list) to send, and the estimate."""

    kept: tuple[int, ...]
    dropped: tuple[int, ...]
    tokens: int
    fits: bool


def plan_input(
    required: str, optional_items: Sequence[str], model: Model, reply_tokens: int
) -> InputPlan:
    """Keep the most important optional items that fit, dropping the lowest priority first.

    `optional_items[0]` is the most important. The kept items are always a prefix of the list. The
    estimate sums per-part estimates, which is never below the estimate of their concatenation;
    separators the caller adds between parts are not counted (make them part of an item if they
    matter). When the required part alone cannot fit, the plan has `fits=False`, keeps nothing,
    and the caller must reject this route: nothing is truncated.
    """
    costs = [estimate_tokens(item) for item in optional_items]
    total = estimate_tokens(required) + sum(costs)
    kept = len(costs)
    while kept > 0 and not fits(model, total, reply_tokens):
        kept -= 1
        total -= costs[kept]
    # when even the required part does not fit, the loop has dropped every optional item
    return InputPlan(
        kept=tuple(range(kept)),
        dropped=tuple(range(kept, len(costs))),
        tokens=total,
        fits=fits(model, total, reply_tokens),
    )
