"""A budget as one unit (issue 43): a window, what it counts, where it applies, a limit, a reason.

Every budget of section 7 and R-SC-1 is a `Budget`: the shared rolling hour (R-RES-1), the rolling
24 h cost (R-RES-2), a source's calls, models and time (R-RES-6..8), and each scope's hour, 24 h
cost and reservations in flight (R-SC-1); `budgets_of(policy)` lists them in the order the SPEC
checks them. The store reads each applicable budget's `Use` inside the reserving write
transaction (one generic read per window, measure and dimension, ledger/store/usage.py) and the
pure `check` decides: the first budget the request does not fit refuses, with the time its window
frees enough. A later budget (say tokens per rolling minute per provider, SPEC section 22) is one
more `Budget` with a measure the request states: nothing here changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import IntEnum, StrEnum

from ledger.budgets.checks import Refusal
from ledger.clock import DAY_MS, HOUR_MS, MINUTE_MS
from ledger.config import Policy, ScopeLimits, TokenLimits
from ledger.globs import matches as glob_matches_key
from ledger.kinds import RefusalReason


class Window(StrEnum):
    """What part of the ledger's history a budget counts."""

    ROLLING_MINUTE = "rolling_minute"  # reservations created in (now - 60 s, now]
    ROLLING_HOUR = "rolling_hour"  # (now - 3600 s, now]
    ROLLING_DAY = "rolling_24h"  # (now - 24 h, now]
    IN_FLIGHT = "in_flight"  # open reservations before their deadline
    LIFETIME = "lifetime"  # everything a source ever used (its counters are never cleared)

    @property
    def length_ms(self) -> int | None:
        """A rolling window's length; None for the others."""
        return _LENGTHS.get(self)


_LENGTHS = {
    Window.ROLLING_MINUTE: MINUTE_MS,
    Window.ROLLING_HOUR: HOUR_MS,
    Window.ROLLING_DAY: DAY_MS,
}


class Measure(StrEnum):
    """What a budget counts; a request states how much of each it takes."""

    CALLS = "calls"  # one per reservation
    COST = "estimated_cost_micro"  # actual where settled, else the estimate (R-RES-2)
    TOKENS = "tokens"  # usage where settled, else the estimate (SPEC section 22)
    INPUT_TOKENS = "input_tokens"  # the input part of TOKENS
    OUTPUT_TOKENS = "output_tokens"  # the output part of TOKENS
    TIME = "time_ms"  # settled durations plus the whole allowance of open ones (R-RES-8)
    MODELS = "models"  # distinct models (R-RES-7): a model already counted takes nothing


class Dimension(StrEnum):
    """Where a budget applies: everything, or the request's source, provider, model or a scope."""

    GLOBAL = "global"
    SOURCE = "source"
    PROVIDER = "provider"
    MODEL = "model"
    SCOPE = "scope"
    GLOB = "glob"  # one shared window over every model key a glob matches (R-TOK-1)


class Stage(IntEnum):
    """Where in the reserve's order (R-RES-1..9, R-SC-1) a budget is checked."""

    SHARED = 1  # with R-RES-1..2, before the source's own checks: nothing, override included, skips
    SOURCE = 2  # with R-RES-6..8, after backoff and cooldowns: an override (R-RES-9) skips
    SCOPE = 3  # with R-SC-1, after every check of section 7
    TOKENS = 4  # R-TOK-2: a provider's, model's or glob's token windows; an override skips none


@dataclass(frozen=True)
class AppliesTo:
    """A dimension and, for a scope (or any fixed target), its name; None: the request's own."""

    dimension: Dimension
    name: str | None = None


GLOBAL = AppliesTo(Dimension.GLOBAL)


@dataclass(frozen=True)
class Budget:
    """At most `limit` of `measure` over `window` where it applies; else refused `reason`."""

    window: Window
    measure: Measure
    applies_to: AppliesTo
    limit: int
    reason: str
    stage: Stage = Stage.SHARED


UsageKey = tuple[Window, Measure, Dimension, str]
"""What one read counts: a window, a measure, a dimension and its target ("" for global)."""


@dataclass(frozen=True)
class Use:
    """How much of a budget's measure its window holds now.

    `leaving`, oldest first, says when parts of it leave the window (leaves_at, amount): read for
    a refusal only (None: not read). A count's store reads the one time its excess has left
    by, as one entry; an in-flight window's the earliest deadline of its open reservations.
    """

    used: int
    leaving: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class Request:
    """What a reservation asks of the budgets: its targets and how much of each measure it takes
    (None: unknown, e.g. an unknown price; a budget on it then fails closed)."""

    now_ms: int
    source: str
    provider: str
    model: str
    scopes: Sequence[str] = ()
    amounts: Mapping[Measure, int | None] = field(default_factory=dict)


def target(applies_to: AppliesTo, request: Request) -> str:
    """The one target of `applies_to` for this request ("" for global)."""
    if applies_to.name is not None:
        return applies_to.name
    dim = applies_to.dimension
    if dim is Dimension.SOURCE:
        return request.source
    if dim is Dimension.PROVIDER:
        return request.provider
    if dim is Dimension.MODEL:
        return request.model
    return ""


def matches(applies_to: AppliesTo, request: Request) -> bool:
    """Whether a budget with a fixed target applies to this request's model (a scope's: by the
    request's scopes, `applicable`)."""
    dim, name = applies_to.dimension, applies_to.name
    if name is None or dim is Dimension.SCOPE:
        return True
    if dim is Dimension.PROVIDER:
        return request.provider == name
    if dim is Dimension.MODEL:
        return request.model == name
    if dim is Dimension.GLOB:
        return glob_matches_key(request.model, name)
    return True


def key(budget: Budget, request: Request) -> UsageKey:
    """The usage a budget needs for this request."""
    dim = budget.applies_to.dimension
    return (budget.window, budget.measure, dim, target(budget.applies_to, request))


def applicable(budgets: Iterable[Budget], scopes: Sequence[str]) -> dict[Stage, tuple[Budget, ...]]:
    # (token budgets of a fixed provider, model or glob are further filtered per request by
    # `matches`: `check` skips one that does not match the request's model)
    """The budgets that apply to a request under `scopes`, by stage, each in the order it is
    checked: the scopes' in the order of `scopes` (each scope's own in its order), every other
    in the given order (the policy's before any added one)."""
    rank = {name: i for i, name in enumerate(scopes)}
    found = [b for b in budgets if b.applies_to.dimension is not Dimension.SCOPE
             or b.applies_to.name in rank]
    found.sort(key=lambda b: rank[b.applies_to.name or ""] if b.stage is Stage.SCOPE else 0)
    return {stage: tuple(b for b in found if b.stage is stage) for stage in Stage}


def check(budgets: Iterable[Budget], usage: Mapping[UsageKey, Use], request: Request) -> (
    Refusal | None
):
    """The first budget `request` does not fit refuses, with when its window frees enough (None:
    never, unknown, or not read yet: `Use.leaving` is None); None when every one fits.

    A measure the request cannot state fails closed (an unknown price: `unknown_price`).
    """
    for budget in budgets:
        if budget.stage is Stage.TOKENS and not matches(budget.applies_to, request):
            continue
        amount = request.amounts.get(budget.measure)
        scope = budget.applies_to.name if budget.applies_to.dimension is Dimension.SCOPE else None
        if amount is None:
            unknown = RefusalReason.UNKNOWN_PRICE  # an unknown price (R-RES-2)
            reason = unknown if budget.measure is Measure.COST else budget.reason
            return Refusal(reason, scope=scope, budget=budget)
        if amount == 0 and budget.measure is Measure.MODELS:
            continue  # a model the source already used adds no model
        use = usage[key(budget, request)]
        if use.used + amount > budget.limit:
            retry = frees_at(request.now_ms, budget, use, amount)
            return Refusal(budget.reason, retry, scope=scope, budget=budget)
    return None


def frees_at(now_ms: int, budget: Budget, use: Use, amount: int) -> int | None:
    """When enough of `use` has left the window for `amount` under the limit: `now_ms` if it fits
    now, None if it never will (the amount alone exceeds the limit, a lifetime counter, nothing
    known to leave) or `use.leaving` was not read."""
    if amount > budget.limit or use.leaving is None or budget.window is Window.LIFETIME:
        return None
    excess = use.used + amount - budget.limit
    if excess <= 0:
        return now_ms
    for leaves_at, part in use.leaving:
        excess -= part
        if excess <= 0:
            return max(leaves_at, now_ms)
    return None


def _micro(usd: float | None) -> int | None:
    """A USD ceiling in whole micro-USD, rounded down (never exceeded)."""
    return None if usd is None else math.floor(Decimal(str(usd)) * 1_000_000)


def scope_budgets(name: str, limits: ScopeLimits) -> tuple[Budget, ...]:
    """One scope's budgets in R-SC-1's order: its hour, its 24 h cost, its calls in flight."""
    to = AppliesTo(Dimension.SCOPE, name)
    out = []
    if limits.calls_per_hour is not None:
        out.append(Budget(Window.ROLLING_HOUR, Measure.CALLS, to, limits.calls_per_hour,
                          RefusalReason.SCOPE_HOURLY_BUDGET, Stage.SCOPE))
    ceiling = _micro(limits.daily_estimated_usd)
    if ceiling is not None:
        out.append(Budget(Window.ROLLING_DAY, Measure.COST, to, ceiling,
                          RefusalReason.SCOPE_DAILY_COST, Stage.SCOPE))
    if limits.in_flight is not None:
        out.append(Budget(Window.IN_FLIGHT, Measure.CALLS, to, limits.in_flight,
                          RefusalReason.SCOPE_IN_FLIGHT, Stage.SCOPE))
    return (*out, *token_budgets(to, limits, Stage.SCOPE))


_TOKEN_WINDOWS = (
    ("tokens_per_minute", Window.ROLLING_MINUTE, Measure.TOKENS),
    ("input_tokens_per_minute", Window.ROLLING_MINUTE, Measure.INPUT_TOKENS),
    ("output_tokens_per_minute", Window.ROLLING_MINUTE, Measure.OUTPUT_TOKENS),
    ("tokens_per_day", Window.ROLLING_DAY, Measure.TOKENS),
)


def token_target(name: str) -> AppliesTo:
    """R-TOK-1: a glob (`*`, `?`), a model key (`/`) or a provider name."""
    if "*" in name or "?" in name:
        return AppliesTo(Dimension.GLOB, name)
    return AppliesTo(Dimension.MODEL if "/" in name else Dimension.PROVIDER, name)


def token_budgets(to: AppliesTo, limits: TokenLimits, stage: Stage) -> tuple[Budget, ...]:
    """The token windows `limits` sets on one target or scope (R-TOK-1), refused
    `token_budget`."""
    return tuple(
        Budget(window, measure, to, limit, RefusalReason.TOKEN_BUDGET, stage)
        for attr, window, measure in _TOKEN_WINDOWS
        if (limit := getattr(limits, attr)) is not None
    )


def budgets_of(policy: Policy) -> tuple[Budget, ...]:
    """Every budget `policy` sets, in the SPEC's order: R-RES-1, R-RES-2, R-RES-6..8, then each
    scope's (R-SC-1, in name order; a reserve orders them as its request lists them)."""
    source = AppliesTo(Dimension.SOURCE)
    out = [Budget(Window.ROLLING_HOUR, Measure.CALLS, GLOBAL, policy.calls_per_hour,
                  RefusalReason.SHARED_HOURLY_BUDGET)]
    ceiling = _micro(policy.daily_estimated_usd)
    if ceiling is not None:
        out.append(Budget(Window.ROLLING_DAY, Measure.COST, GLOBAL, ceiling,
                          RefusalReason.DAILY_COST_CEILING))
    out += [
        Budget(Window.LIFETIME, Measure.CALLS, source, policy.source_calls,
               RefusalReason.SOURCE_CALLS, Stage.SOURCE),
        Budget(Window.LIFETIME, Measure.MODELS, source, policy.source_models,
               RefusalReason.SOURCE_MODELS, Stage.SOURCE),
        Budget(Window.LIFETIME, Measure.TIME, source, policy.source_time_ms,
               RefusalReason.SOURCE_TIME, Stage.SOURCE),
    ]
    for name in sorted(policy.scopes):
        out += scope_budgets(name, policy.scopes[name])
    for name in sorted(policy.token_budgets):
        out += token_budgets(token_target(name), policy.token_budgets[name], Stage.TOKENS)
    return tuple(out)
