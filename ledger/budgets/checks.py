"""Budget arithmetic for one reservation (SPEC section 7): pure, takes `now`, gives Grant/Refusal.

The store reads the budgets' use inside the write transaction and writes what
`ledger.admission.check` decides, so the checks and the insert are one atomic step (R-DB-2).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING

from ledger.catalog import Model
from ledger.clock import DAY_MS as DAY_MS  # the windows, re-exported for the store
from ledger.clock import HOUR_MS as HOUR_MS
from ledger.config import Policy
from ledger.kinds import RefusalReason, SourceState

if TYPE_CHECKING:
    from ledger.budgets.unit import Budget


@dataclass(frozen=True)
class SourceBudget:
    """What a source has used so far (counters are never cleared by an override)."""

    state: SourceState
    retry_at_ms: int | None
    calls: int
    models: frozenset[str]
    time_used_ms: int


@dataclass(frozen=True)
class Grant:
    """Permission for exactly one call."""

    deadline_ms: int
    estimate_micro: int | None


@dataclass(frozen=True)
class Refusal:
    """A refused reservation with its reason code and, when known, when it could succeed."""

    reason: str  # a RefusalReason, or an added budget's own (ledger.budgets.unit)
    retry_at_ms: int | None = None
    scope: str | None = None  # the scope that refused (R-SC-1), None for every other check
    # the budget that refused (ledger.budgets.unit.check), None for every other check
    budget: Budget | None = field(default=None, compare=False, repr=False)
    detail: str = ""  # what refused, when no budget or scope names it (R-TOK-4's model)


@dataclass(frozen=True)
class DailyWindow:
    """The rolling 24 h cost under a ceiling (R-RES-2), read in one transaction.

    `leaving` lists, oldest first, when each cost in the window leaves it (created + 24 h) and how
    much; its costs add up to `spent_micro`. With `room_for_micro` set the rows were not read
    (`leaving` is empty): the spend leaves room for any estimate up to that much, so
    `ceiling_frees_at` never needs them for such an estimate.
    """

    spent_micro: int
    ceiling_micro: int
    leaving: tuple[tuple[int, int], ...]
    room_for_micro: int | None = None


def ceiling_micro(policy: Policy) -> int | None:
    """`dailyEstimatedUsd` in whole micro-USD (rounded down: the ceiling is never exceeded)."""
    if policy.daily_estimated_usd is None:
        return None
    return math.floor(Decimal(str(policy.daily_estimated_usd)) * 1_000_000)


def ceiling_frees_at(now_ms: int, window: DailyWindow, estimate: int) -> int | None:
    """When the rolling 24 h cost leaves room for `estimate` under the ceiling (R-SEL-10).

    `now_ms` if it fits now; None if it never will (the estimate alone exceeds the ceiling).
    """
    if estimate > window.ceiling_micro:
        return None
    excess = window.spent_micro + estimate - window.ceiling_micro
    if excess <= 0:
        return now_ms
    if window.room_for_micro is not None:  # a caller bug, never a silent "never"
        raise ValueError("this window was read for smaller estimates; its rows are needed")
    for leaves_at, cost in window.leaving:
        excess -= cost
        if excess <= 0:
            return max(leaves_at, now_ms)
    return None


def largest_estimate(
    models: Iterable[Model], input_bytes: int, reply_tokens: int, ceiling: int
) -> int:
    """The largest estimate among `models` that fits under `ceiling` alone (0 when none does):
    the most room under the ceiling a selection of this request can ask about (R-SEL-10)."""
    fitting = (
        e
        for m in models
        if (e := estimate_micro(m, input_bytes, reply_tokens)) is not None and e <= ceiling
    )
    return max(fitting, default=0)


def estimate_micro(model: Model, input_bytes: int, reply_tokens: int) -> int | None:
    """Input bytes x highest input price + reply reservation x highest output tier, in micro-USD.

    A token is at least one byte, so bytes bound tokens from above; the highest input price is the
    highest per-token price any prompt token can be billed at (a cache write may cost more than
    plain input). USD/MTok x tokens = micro-USD. None when the price is unknown.
    """
    prices = model.max_prices()
    in_price = model.max_input_price()
    if prices is None or in_price is None:
        return None
    allowance = model.reply_reservation(reply_tokens)
    return math.ceil(Decimal(input_bytes) * in_price + Decimal(allowance) * prices[1])


def actual_micro(
    model: Model,
    input_tokens: int,
    output_tokens: int,
    cache_write_tokens: int = 0,
    cache_read_tokens: int = 0,
) -> int | None:
    """Cost of reported usage in micro-USD; None when prices are unknown.

    `input_tokens` are the uncached prompt tokens; cache writes and reads come on top. The tier is
    the one the whole prompt (cached tokens included) falls in. A cache price that is missing or
    zero is never taken as free: such tokens cost the highest input price the model can bill.
    """
    if not model.price_known():
        return None
    if model.unbilled:
        return 0
    tier = model.tier_for(input_tokens + cache_write_tokens + cache_read_tokens)
    fallback = model.max_input_price()
    assert tier.input_usd_per_mtok is not None
    assert fallback is not None
    output_price = tier.output_usd_per_mtok or 0  # unset only for an embedding model (R-FMT-3)
    return math.ceil(
        Decimal(input_tokens) * Decimal(str(tier.input_usd_per_mtok))
        + Decimal(output_tokens) * Decimal(str(output_price))
        + Decimal(cache_write_tokens) * _cache_price(tier.cache_write_usd_per_mtok, fallback)
        + Decimal(cache_read_tokens) * _cache_price(tier.cache_read_usd_per_mtok, fallback)
    )


def _cache_price(price: float | None, fallback: Decimal) -> Decimal:
    """A tier's cache price; a missing or zero one is the fallback (never free)."""
    return Decimal(str(price)) if price else fallback


def usd_to_micro(usd: float) -> int:
    """Round a provider-reported USD amount up to whole micro-USD."""
    return math.ceil(Decimal(str(usd)) * 1_000_000)


SPENT_REASONS = frozenset({RefusalReason.SOURCE_CALLS, RefusalReason.SOURCE_TIME})
"""Refusals that leave a source nothing to do but wait for an operator (its counters only grow)."""


def spent_reason(policy: Policy, src: SourceBudget) -> RefusalReason | None:
    """`source_calls` / `source_time` when the source has used that cap (R-RES-6, R-RES-8)."""
    if src.calls >= policy.source_calls:
        return RefusalReason.SOURCE_CALLS
    if src.time_used_ms >= policy.source_time_ms:
        return RefusalReason.SOURCE_TIME
    return None
