"""Learned limits at the reserve (R-TOK-4): pure, what is left of a provider's reported token
limits in, the refusal out.

What is left of a kind is the remaining the provider last reported minus the estimates granted on
the model since (ledger/store/learned.py reads it in the reserving transaction). A reservation
whose estimate of that kind does not fit is refused `provider_tokens_exhausted` until the reading
resets, before the provider's own 429. An override skips nothing here: the provider's limit is
the provider's.
"""

from __future__ import annotations

from collections.abc import Mapping

from ledger.budgets.checks import Refusal
from ledger.budgets.unit import Measure
from ledger.kinds import RefusalReason
from ledger.learned import LimitKind

MEASURES: Mapping[LimitKind, Measure] = {
    LimitKind.TOKENS: Measure.TOKENS,
    LimitKind.INPUT_TOKENS: Measure.INPUT_TOKENS,
    LimitKind.OUTPUT_TOKENS: Measure.OUTPUT_TOKENS,
}
"""The budget measure counting the same tokens as a learned limit's kind."""


def exhausted(
    left: Mapping[LimitKind, int], amounts: Mapping[Measure, int | None]
) -> LimitKind | None:
    """The first kind (in LimitKind order) whose estimate does not fit what is left; None when
    every live reading has room."""
    for kind in LimitKind:
        room = left.get(kind)
        if room is not None and (amounts.get(MEASURES[kind]) or 0) > room:
            return kind
    return None


def refusal(kind: LimitKind, left: int, model_key: str, reset_at_ms: int | None) -> Refusal:
    """`provider_tokens_exhausted` naming the model and what is left, retried at the reset."""
    detail = f"{kind.value} remaining {max(0, left)} of model {model_key}"
    return Refusal(RefusalReason.PROVIDER_TOKENS_EXHAUSTED, reset_at_ms, detail=detail)
