"""The selector (SPEC section 9): a pure function from catalog, policy and a ledger snapshot to
ordered routes plus every other catalog model with the reason it was left out.

Invariants: every catalog model appears exactly once, either in `routes` or in `excluded` (with the
first rule of `RULE_ORDER` that excludes it); the order of routes depends only on the models, never
on catalog order; no I/O and no clock. A selection grants no call authority (R-RES-10): only a
reservation does, and it re-checks budgets and cooldowns in its own write transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from ledger.catalog import Catalog, Model
from ledger.clock import iso
from ledger.config import Policy
from ledger.kinds import CooldownOrigin, CooldownScope, ExclusionReason, FailureKind
from ledger.routes import route_allowed
from ledger.tokens import fits

# The failure kinds after which a sibling named in fallbackModels may be used (R-SEL-4).
MODEL_SPECIFIC_KINDS = frozenset(
    {FailureKind.RATE_LIMIT, FailureKind.INVALID_OUTPUT, FailureKind.REQUEST_REJECTED}
)

R = ExclusionReason

# The fixed order in which rules are checked; a model is excluded by the first one that applies.
# The four "fallback" rules (same_provider .. not_in_fallback_list) apply to every model except the
# default model of a fresh request (no failure yet). `not_in_fallback_list` also carries R-SEL-3:
# with crossProviderFallback false every model but the default is "not in the fallback list" (and
# with no default model nothing is eligible: the privacy boundary fails closed). Siblings are judged
# against the failed model's provider and, for backups, against the default model's provider.
RULE_ORDER: tuple[ExclusionReason, ...] = (
    R.UNAVAILABLE,  # provider not available (R-CAT-2)
    R.NO_TEXT,  # R-SEL-1
    R.DENIED_BY_ROUTE,  # R-SEL-9
    R.ALREADY_TRIED,  # tried in this queue item; the failed model always counts as tried
    R.SAME_PROVIDER,  # R-SEL-4
    R.SIBLING_NOT_FOR_KIND,  # R-SEL-4
    R.NOT_IN_FALLBACK_LIST,  # R-SEL-5, R-SEL-3
    R.PROVIDER_COOLDOWN,  # R-SEL-7, R-POL-2
    R.MODEL_COOLDOWN,  # R-SEL-7, R-POL-2
    R.SOURCE_MODELS,  # R-RES-7
    R.CONTEXT_TOO_SMALL,  # R-SEL-8
    R.UNKNOWN_PRICE,  # R-RES-2, only under dailyEstimatedUsd
)

_COOLDOWN_REASONS = frozenset({R.PROVIDER_COOLDOWN, R.MODEL_COOLDOWN})


@dataclass(frozen=True)
class CooldownView:
    """One cooldown as read from the ledger."""

    scope: CooldownScope
    target: str
    until_ms: int
    kind: str
    origin: CooldownOrigin


@dataclass(frozen=True)
class SelectionRequest:
    """What the caller asks for: default model, request size, and the failure it recovers from."""

    default_model: str | None  # the caller's --model, else policy.default_model, else None
    input_tokens: int = 0  # token estimate of the request (ledger.tokens)
    after_failure: FailureKind | None = None
    failed_model: str | None = None
    tried: frozenset[str] = frozenset()  # models already tried in this queue item


@dataclass(frozen=True)
class Snapshot:
    """The ledger state selection depends on, read in one short read transaction."""

    now_ms: int
    available_providers: frozenset[str]
    cooldowns: tuple[CooldownView, ...]  # active ones; filtered against now_ms again anyway
    source_models: frozenset[str] = frozenset()  # distinct models this source already used
    hourly_next_free_ms: int | None = None  # None: a shared hourly slot is free now


@dataclass(frozen=True)
class Exclusion:
    """A catalog model left out, with the first rule that excluded it.

    For cooldown reasons `until_ms` is when the model stops cooling (the latest end among the
    active provider and model cooldowns that cover it); otherwise None.
    """

    model: str
    reason: ExclusionReason
    until_ms: int | None = None


@dataclass(frozen=True)
class Selection:
    """Ordered eligible routes, every excluded model, and when waiting would help (R-SEL-10).

    `retry_at_ms` when routes is empty: the earliest time a model excluded only by cooldowns frees,
    or, if the shared hourly budget is also full, the later of that and the next free slot; None
    when no amount of waiting yields a route. When routes exist but the hourly budget is full,
    routes are listed as usual and `retry_at_ms` is the next free slot: reserving would be refused
    (R-RES-1) until then.
    """

    routes: tuple[str, ...]
    excluded: tuple[Exclusion, ...]
    retry_at_ms: int | None

    def to_json(self) -> dict[str, object]:
        """JSON data: routes, excluded models with reasons, retry_at as ISO-8601 UTC or null."""
        return {
            "routes": list(self.routes),
            "excluded": [{"model": e.model, "reason": str(e.reason)} for e in self.excluded],
            "retry_at": iso(self.retry_at_ms),
        }


def _provider_of(key: str) -> str:
    return key.partition("/")[0]


def _price_rank(model: Model) -> tuple[int, Decimal]:
    """Known non-zero prices first, cheapest first; unknown or any zero price after (R-SEL-6)."""
    prices = model.max_prices()
    if prices is None or prices[0] <= 0 or prices[1] <= 0:
        return (1, Decimal(0))
    return (0, prices[0] + prices[1])


def fallback_order(catalog: Catalog, policy: Policy, candidates: Iterable[Model]) -> list[Model]:
    """Backup order: fallbackModels order when non-empty (R-SEL-5), else R-SEL-6.

    R-SEL-6: known non-zero prices, cheapest (max input + max output tier price) first; unknown or
    zero prices after; then non-reasoning before reasoning; then model key (a total order).
    Candidates missing from a non-empty list sort after the listed ones by the R-SEL-6 key. The
    catalog is accepted so status can call this like `select`; the order needs only the models.
    """
    del catalog
    listed = {key: i for i, key in enumerate(policy.fallback_models)}
    unlisted = len(listed)

    def sort_key(model: Model) -> tuple[int, tuple[int, Decimal], bool, str]:
        return (listed.get(model.key, unlisted), _price_rank(model), model.reasoning, model.key)

    return sorted(candidates, key=sort_key)


@dataclass(frozen=True)
class _Context:
    """Values derived once per selection."""

    policy: Policy
    snapshot: Snapshot
    request: SelectionRequest
    tried: frozenset[str]
    failed_provider: str | None
    default_provider: str | None
    cooling: dict[tuple[CooldownScope, str], int]  # latest active end per (scope, target)


def _fallback_reason(ctx: _Context, model: Model) -> ExclusionReason | None:
    """same_provider, sibling_not_for_kind, not_in_fallback_list (R-SEL-3..5)."""
    request, policy = ctx.request, ctx.policy
    default = request.default_model
    listed = model.key in policy.fallback_models
    model_specific = request.after_failure in MODEL_SPECIFIC_KINDS
    if model.provider == ctx.failed_provider:
        # A sibling of the failed model shares its credentials and quota. Only a listed sibling
        # (or the default itself) may follow, and only after a model-specific failure.
        if model.key == default and model_specific:
            pass
        elif model.key == default or not listed:
            return R.SAME_PROVIDER
        elif not model_specific:
            return R.SIBLING_NOT_FOR_KIND
    elif model.provider == ctx.default_provider and model.key != default and not listed:
        return R.SAME_PROVIDER  # never chosen automatically as a backup of the default
    if model.key == default:
        return None
    if not policy.cross_provider_fallback:
        return R.NOT_IN_FALLBACK_LIST  # R-SEL-3: confined to the default model
    if policy.fallback_models and not listed:
        return R.NOT_IN_FALLBACK_LIST
    return None


def _active_cooldowns(snapshot: Snapshot) -> dict[tuple[CooldownScope, str], int]:
    """The latest end of the still active cooldowns, per (scope, target)."""
    ends: dict[tuple[CooldownScope, str], int] = {}
    for c in snapshot.cooldowns:
        if c.until_ms > snapshot.now_ms:
            target = (c.scope, c.target)
            ends[target] = max(c.until_ms, ends.get(target, c.until_ms))
    return ends


def _late_reason(ctx: _Context, model: Model) -> ExclusionReason | None:
    """The rules after the cooldowns: source_models, context_too_small, unknown_price."""
    policy, snapshot = ctx.policy, ctx.snapshot
    used = snapshot.source_models
    if model.key not in used and len(used) + 1 > policy.source_models:
        return R.SOURCE_MODELS
    if not fits(model, ctx.request.input_tokens, policy.reply_tokens):
        return R.CONTEXT_TOO_SMALL
    if policy.daily_estimated_usd is not None and not model.price_known():
        return R.UNKNOWN_PRICE
    return None


def _exclusion(ctx: _Context, model: Model) -> tuple[Exclusion | None, bool]:
    """The first rule excluding the model (or None), and whether it frees once its cooldowns end."""
    key = model.key
    early: ExclusionReason | None = None
    if model.provider not in ctx.snapshot.available_providers:
        early = R.UNAVAILABLE
    elif not model.text_capable:
        early = R.NO_TEXT
    elif not route_allowed(key, ctx.policy.routes):
        early = R.DENIED_BY_ROUTE
    elif key in ctx.tried:
        early = R.ALREADY_TRIED
    elif ctx.request.after_failure is not None or key != ctx.request.default_model:
        early = _fallback_reason(ctx, model)
    if early is not None:
        return Exclusion(key, early), False
    provider_until = ctx.cooling.get((CooldownScope.PROVIDER, model.provider))
    model_until = ctx.cooling.get((CooldownScope.MODEL, key))
    late = _late_reason(ctx, model)
    if provider_until is not None or model_until is not None:
        reason = R.PROVIDER_COOLDOWN if provider_until is not None else R.MODEL_COOLDOWN
        until = max(u for u in (provider_until, model_until) if u is not None)
        return Exclusion(key, reason, until), late is None
    return (None if late is None else Exclusion(key, late)), False


def select(
    catalog: Catalog, policy: Policy, snapshot: Snapshot, request: SelectionRequest
) -> Selection:
    """Ordered eligible routes (default first, R-SEL-2) and every other model with its reason."""
    tried = request.tried | ({request.failed_model} if request.failed_model else frozenset())
    ctx = _Context(
        policy=policy,
        snapshot=snapshot,
        request=request,
        tried=tried,
        failed_provider=_provider_of(request.failed_model) if request.failed_model else None,
        default_provider=_provider_of(request.default_model) if request.default_model else None,
        cooling=_active_cooldowns(snapshot),
    )
    eligible: list[Model] = []
    excluded: list[Exclusion] = []
    frees_at: list[int] = []
    for model in catalog.models:
        exclusion, frees = _exclusion(ctx, model)
        if exclusion is None:
            eligible.append(model)
            continue
        excluded.append(exclusion)
        if frees and exclusion.until_ms is not None:
            frees_at.append(exclusion.until_ms)
    default = [m for m in eligible if m.key == request.default_model]
    backups = fallback_order(
        catalog, policy, (m for m in eligible if m.key != request.default_model)
    )
    routes = tuple(m.key for m in default + backups)
    return Selection(
        routes=routes,
        excluded=tuple(sorted(excluded, key=lambda e: e.model)),
        retry_at_ms=_retry_at(routes, frees_at, snapshot.hourly_next_free_ms),
    )


def _retry_at(
    routes: tuple[str, ...], frees_at: list[int], hourly_next_free_ms: int | None
) -> int | None:
    """R-SEL-10: when waiting yields a reservable route, or None if waiting does not help."""
    if routes:
        return hourly_next_free_ms
    if not frees_at:
        return None
    soonest = min(frees_at)
    return soonest if hourly_next_free_ms is None else max(soonest, hourly_next_free_ms)
