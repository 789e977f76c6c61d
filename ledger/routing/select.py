"""The selector (SPEC section 9): a pure function from catalog, policy and a ledger snapshot to
ordered routes plus every other catalog model with the reason it was left out.

Invariants: every catalog model appears exactly once, either in `routes` or in `excluded` (with the
first rule of `RULE_ORDER` that excludes it); the order of routes depends only on the models, never
on catalog order; no I/O and no clock. A selection grants no call authority (R-RES-10): only a
reservation does, and it re-checks budgets and cooldowns in its own write transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from operator import attrgetter
from typing import Protocol

from ledger.budgets.checks import DailyWindow, ceiling_frees_at, estimate_micro
from ledger.catalog import Catalog, Model
from ledger.clock import iso
from ledger.config import Policy
from ledger.kinds import CooldownOrigin, CooldownScope, ExclusionReason, FailureKind
from ledger.routing.chains import ChainMatch, allowlist, cascade, expand, pool_members
from ledger.routing.exclusion import Exclusion
from ledger.routing.kind import request_kind
from ledger.routing.pools import PoolView, pool_view
from ledger.routing.room import NOTHING_READ, TokenRoom, exclusions
from ledger.routing.rules import confinement_reason, route_allowed
from ledger.targets import Effort, Target, is_pool_key
from ledger.tokens import tokens_for_bytes
from ledger.validation import Slot

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
    R.NO_BASE_URL,  # available but no baseUrl to call (issue 13): never defaulted to another host
    R.NO_TEXT,  # R-SEL-1
    R.MODEL_KIND,  # R-FMT-3: a chat request never lands on an embedding model, nor the reverse
    R.DENIED_BY_ROUTE,  # R-SEL-9
    R.ALREADY_TRIED,  # tried in this queue item; the failed model always counts as tried
    R.SAME_PROVIDER,  # R-SEL-4
    R.SIBLING_NOT_FOR_KIND,  # R-SEL-4
    R.NOT_IN_FALLBACK_LIST,  # R-SEL-5, R-SEL-3
    R.PROVIDER_COOLDOWN,  # R-SEL-7, R-POL-2
    R.MODEL_COOLDOWN,  # R-SEL-7, R-POL-2
    R.PROBING,  # R-SEL-7, R-POL-9: another reservation is the recovery probe
    R.TOKEN_BUDGET,  # R-SEL-7, R-TOK-4: a token window of a target it falls under is full
    R.PROVIDER_TOKENS_EXHAUSTED,  # R-SEL-7, R-TOK-4: its provider's learned limit is
    R.SOURCE_MODELS,  # R-RES-7
    R.CONTEXT_TOO_SMALL,  # R-SEL-8
    R.UNKNOWN_PRICE,  # R-RES-2, only under dailyEstimatedUsd
)


class ActiveCooldown(Protocol):
    """What selection reads of a cooldown (`CooldownView`, or the store's own row type)."""

    @property
    def scope(self) -> CooldownScope:
        """Provider or model."""

    @property
    def target(self) -> str:
        """Provider name or model key."""

    @property
    def until_ms(self) -> int:
        """When it ends."""


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
    # (a model or pool key without its effort; the effort is `default_effort`, R-RT-2)
    input_tokens: int = 0  # token estimate of the request (ledger.tokens)
    after_failure: FailureKind | None = None
    failed_model: str | None = None
    tried: frozenset[str] = frozenset()  # models already tried in this queue item
    input_bytes: int = 0  # the request size reserve estimates its cost from (R-RES-2)
    default_effort: Effort | None = None


class Route(str):
    """One offered route: its key (a model key or `pool/NAME`; the object is that string, so
    code that reads routes as keys keeps working), the effort for this route only (R-RT-2) and,
    for a pool route, the pool's name (the reserve picks the concrete candidate, R-RT-5)."""

    effort: Effort | None
    pool: str | None

    def __new__(cls, key: str, effort: Effort | None = None) -> Route:
        route = super().__new__(cls, key)
        route.effort = effort
        route.pool = key[len("pool/") :] if is_pool_key(key) else None
        return route

    def to_json(self) -> dict[str, object]:
        """`{route, effort, pool}`."""
        return {"route": str(self), "effort": self.effort, "pool": self.pool}


@dataclass(frozen=True)
class Snapshot:
    """The ledger state selection depends on, read in one short read transaction."""

    now_ms: int
    available_providers: frozenset[str]
    cooldowns: tuple[ActiveCooldown, ...]  # active ones; filtered against now_ms again anyway
    source_models: frozenset[str] = frozenset()  # distinct models this source already used
    hourly_next_free_ms: int | None = None  # None: a shared hourly slot is free now
    daily: DailyWindow | None = None  # the rolling 24 h cost, when dailyEstimatedUsd is set
    # recovery probes in flight (R-POL-9): target and the probe's deadline (`until_ms`)
    probing: tuple[ActiveCooldown, ...] = ()
    # the token windows of tokenBudgets' targets and the learned limits (R-TOK-4)
    tokens: TokenRoom = NOTHING_READ


@dataclass(frozen=True)
class Selection:
    """Ordered eligible routes, every excluded model, and when waiting would help (R-SEL-10).

    `retry_at_ms` when routes is empty: the earliest time a model excluded only by cooldowns frees,
    or, if the shared hourly budget is also full, the later of that and the next free slot; None
    when no amount of waiting yields a route. When routes exist but the hourly budget is full,
    routes are listed as usual and `retry_at_ms` is the next free slot: reserving would be refused
    (R-RES-1) until then.
    """

    routes: tuple[str, ...]  # each a `Route` when made by `select`
    excluded: tuple[Exclusion, ...]
    retry_at_ms: int | None
    chain: ChainMatch | None = None  # the primary's chain and why it matched (R-RT-1)
    pools: tuple[PoolView, ...] = ()  # each pool route considered, candidates with state

    def excluded_by_reason(self) -> dict[str, int]:
        """How many models each reason excluded, in RULE_ORDER (reasons with none left out)."""
        counts = Counter(e.reason for e in self.excluded)
        return {str(r): counts[r] for r in RULE_ORDER if counts[r]}

    def to_json(self, catalog: Catalog | None = None) -> dict[str, object]:
        """JSON data: routes, excluded models with reasons, per-reason counts, retry_at (ISO).

        With the catalog, an `unavailable` model also names the credential variable to set.
        """
        doc: dict[str, object] = {
            "routes": list(self.routes),
            "excluded": [exclusion_json(e, catalog) for e in self.excluded],
            "excluded_by_reason": self.excluded_by_reason(),
            "retry_at": iso(self.retry_at_ms),
        }
        if self.chain is not None:
            doc["chain"] = self.chain.to_json()
        doc["targets"] = [
            r.to_json() if isinstance(r, Route) else Route(r).to_json() for r in self.routes
        ]
        if self.pools:
            doc["pools"] = [p.to_json() for p in self.pools]
        return doc


def exclusion_json(exclusion: Exclusion, catalog: Catalog | None = None) -> dict[str, object]:
    """`{model, reason}` (`until` for cooling reasons), plus `credential_env` (a variable's
    name, never its value) for an unavailable model, and `base_url_missing` when its provider
    also has no base URL: every piece that is missing, not only the first."""
    doc = exclusion.to_json()
    if exclusion.reason == R.UNAVAILABLE and catalog is not None:
        provider = _provider_of(exclusion.model)
        doc["credential_env"] = catalog.credential_to_set(provider)
        if provider in catalog.providers_without_base_url():
            # setting the credential alone would only turn it into `no_base_url` (issue 33)
            doc["base_url_missing"] = True
    return doc


def _provider_of(key: str) -> str:
    return key.partition("/")[0]


def _price_rank(model: Model) -> tuple[int, Decimal]:
    """Known non-zero prices first, cheapest first; unknown or any zero price after (R-SEL-6)."""
    prices = model.max_prices()
    if prices is None or prices[0] <= 0 or prices[1] <= 0:
        return (1, Decimal(0))
    return (0, prices[0] + prices[1])


_OrderKey = tuple[tuple[int, Decimal], bool, str]


def _order_key(model: Model) -> _OrderKey:
    """R-SEL-6: price rank, then non-reasoning before reasoning, then model key (a total order)."""
    return (_price_rank(model), model.reasoning is not False, model.key)


@dataclass(frozen=True, slots=True)
class _Entry:
    """One catalog model with the values selection reads, derived once per catalog."""

    model: Model
    key: str
    provider: str
    text_capable: bool  # takes and gives text and serves the selection's kind (R-FMT-3)
    out: ExclusionReason  # why it is left out when it is not: no_text or model_kind
    price_known: bool
    order_key: _OrderKey
    rank: int  # position in the R-SEL-6 order of the whole catalog
    route: Route  # this model as a route without an effort (made once)
    # Exclusions are immutable values: kept per reason (and end), made on first use.
    exclusions: dict[ExclusionReason, Exclusion] = field(default_factory=dict)
    cooled: dict[tuple[ExclusionReason, int], Exclusion] = field(default_factory=dict)

    def excluded(self, reason: ExclusionReason) -> Exclusion:
        """This model excluded for `reason` (no end time)."""
        exclusion = self.exclusions.get(reason)
        if exclusion is None:
            exclusion = self.exclusions[reason] = Exclusion(self.key, reason)
        return exclusion

    def cooling(self, reason: ExclusionReason, until_ms: int) -> Exclusion:
        """This model excluded by a cooldown that ends at `until_ms`."""
        exclusion = self.cooled.get((reason, until_ms))
        if exclusion is None:
            if len(self.cooled) >= 8:  # bounded: cooldown ends change over time
                self.cooled.clear()
            exclusion = self.cooled[reason, until_ms] = Exclusion(self.key, reason, until_ms)
        return exclusion


@dataclass(frozen=True)
class _CatalogIndex:
    """Per-catalog derived data (the catalog is frozen, so it never goes stale).

    `entries` is in model-key order (the order of `Selection.excluded`). The two dicts memoise
    values that also depend on a policy setting; they are filled on first use.
    """

    models: list[Model]  # the catalog's own list: a copied catalog with other models rebuilds
    entries: tuple[_Entry, ...]
    by_key: dict[str, _Entry]
    groups: tuple[_Group, ...]  # runs of one provider's entries, in `entries` order
    input_limits: dict[int, tuple[int | None, ...]] = field(default_factory=dict)
    denied: dict[tuple[tuple[str, ...], tuple[str, ...]], frozenset[str]] = field(
        default_factory=dict
    )
    # per reply-token setting, each group's smallest known input limit (None: none known)
    group_limits: dict[int, tuple[int | None, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Group:
    """A run of consecutive entries (key order) of one provider, with what the fast path of
    `select` needs to decide the whole run at once (derived once per catalog)."""

    provider: str
    start: int  # the position of its first entry in `_CatalogIndex.entries`
    entries: tuple[_Entry, ...]
    keys: frozenset[str]
    text: tuple[_Entry, ...]  # the text-capable entries, in key order
    no_text: tuple[Exclusion, ...]  # the others, excluded with no_text (R-SEL-1), in key order
    # each entry excluded by its first reason when every text model is outside the fallback
    # list (no_text, else not_in_fallback_list), in key order
    outside: tuple[Exclusion, ...]
    price_known: bool  # every text entry has a known price


_INDEX: Slot[str, _CatalogIndex] = Slot("selection index")
_by_rank = attrgetter("rank")


def _index(catalog: Catalog, kind: str = "chat") -> _CatalogIndex:
    """The catalog's selection index for requests of `kind` (chat or embedding, R-FMT-3), built
    on first use and kept on the catalog."""
    return catalog.derived.value(
        _INDEX,
        kind,
        lambda: _make_index(catalog, kind),
        lambda index: index.models is catalog.models,
    )


def _make_index(catalog: Catalog, kind: str = "chat") -> _CatalogIndex:
    keyed = sorted(catalog.models, key=attrgetter("key"))  # stable: ties keep catalog order
    ordered = sorted(catalog.models, key=_order_key)
    ranks = {id(m): i for i, m in enumerate(ordered)}
    entries = tuple(
        _Entry(
            model=m,
            key=m.key,
            provider=m.provider,
            text_capable=m.text_capable and m.serves == kind,
            out=R.MODEL_KIND if m.text_capable else R.NO_TEXT,
            price_known=m.price_known(),
            order_key=_order_key(m),
            rank=ranks[id(m)],
            route=Route(m.key),
        )
        for m in keyed
    )
    return _CatalogIndex(catalog.models, entries, {e.key: e for e in entries}, _groups(entries))


def _groups(entries: tuple[_Entry, ...]) -> tuple[_Group, ...]:
    """The runs of consecutive entries sharing a provider."""
    runs: list[list[_Entry]] = []
    starts: list[int] = []
    for n, entry in enumerate(entries):
        if runs and runs[-1][0].provider == entry.provider:
            runs[-1].append(entry)
        else:
            runs.append([entry])
            starts.append(n)
    return tuple(
        _Group(
            provider=run[0].provider,
            start=start,
            entries=tuple(run),
            keys=frozenset(e.key for e in run),
            text=tuple(e for e in run if e.text_capable),
            no_text=tuple(e.excluded(e.out) for e in run if not e.text_capable),
            outside=tuple(
                e.excluded(R.NOT_IN_FALLBACK_LIST if e.text_capable else e.out) for e in run
            ),
            price_known=all(e.price_known for e in run if e.text_capable),
        )
        for run, start in zip(runs, starts, strict=True)
    )


def _group_limits(index: _CatalogIndex, reply_tokens: int) -> tuple[int | None, ...]:
    """Per group, the smallest input limit among its text entries with a known window."""
    limits = index.group_limits.get(reply_tokens)
    if limits is None:
        per_entry = _input_limits(index, reply_tokens)
        mins: list[int | None] = []
        for group in index.groups:
            run = zip(group.entries, per_entry[group.start :], strict=False)
            known = [n for e, n in run if e.text_capable and n is not None]
            mins.append(min(known) if known else None)
        limits = tuple(mins)
        if len(index.group_limits) > 16:  # bounded, as `input_limits`
            index.group_limits.clear()
        index.group_limits[reply_tokens] = limits
    return limits


def _input_limits(index: _CatalogIndex, reply_tokens: int) -> tuple[int | None, ...]:
    """Per entry, the largest input estimate that fits (R-SEL-8); None for an unknown window.

    `tokens <= limit` is exactly `ledger.tokens.fits`: estimate <= window - reply reservation.
    """
    limits = index.input_limits.get(reply_tokens)
    if limits is None:
        limits = tuple(
            None
            if e.model.context_window is None
            else e.model.context_window - e.model.reply_reservation(reply_tokens)
            for e in index.entries
        )
        if len(index.input_limits) > 16:  # a bounded memo: policies rarely change
            index.input_limits.clear()
        index.input_limits[reply_tokens] = limits
    return limits


def _denied(index: _CatalogIndex, policy: Policy) -> frozenset[str]:
    """Keys the route rules deny (R-SEL-9), computed once per catalog and rule set."""
    rules = policy.routes
    if not rules.allow and not rules.deny:
        return frozenset()
    memo_key = (tuple(rules.allow), tuple(rules.deny))
    denied = index.denied.get(memo_key)
    if denied is None:
        denied = frozenset(e.key for e in index.entries if not route_allowed(e.key, rules))
        if len(index.denied) > 16:
            index.denied.clear()
        index.denied[memo_key] = denied
    return denied


def fallback_order(catalog: Catalog, policy: Policy, candidates: Iterable[Model]) -> list[Model]:
    """Backup order: fallbackModels order when non-empty (R-SEL-5), else R-SEL-6.

    R-SEL-6: known non-zero prices, cheapest (max input + max output tier price) first; unknown or
    zero prices after; then non-reasoning before reasoning; then model key (a total order).
    Candidates missing from a non-empty list sort after the listed ones by the R-SEL-6 key. The
    catalog's cached R-SEL-6 keys are used for its own models; other models are keyed directly.
    """
    by_key = _index(catalog).by_key
    listed = {key: i for i, key in enumerate(policy.fallback_models)}
    unlisted = len(listed)

    def sort_key(model: Model) -> tuple[int, _OrderKey]:
        entry = by_key.get(model.key)
        order = entry.order_key if entry is not None and entry.model is model else _order_key(model)
        return (listed.get(model.key, unlisted), order)

    return sorted(candidates, key=sort_key)


@dataclass(frozen=True)
class _Context:
    """Values derived once per selection."""

    policy: Policy
    default: str | None
    primaries: frozenset[str]  # the default's concrete models (a pool's candidates, R-RT-4)
    listed: frozenset[str]  # the models the primary's cascaded chain admits (R-RT-1)
    model_specific: bool  # the failure is one a listed sibling may recover from (R-SEL-4)
    failed_provider: str | None
    default_provider: str | None
    tried: frozenset[str]


def _fallback_reason(ctx: _Context, key: str, provider: str) -> ExclusionReason | None:
    """same_provider, sibling_not_for_kind, not_in_fallback_list (R-SEL-3..5)."""
    is_default = key in ctx.primaries
    listed = key in ctx.listed
    if provider == ctx.failed_provider:
        # A sibling of the failed model shares its credentials and quota. Only a listed sibling
        # (or the default itself) may follow, and only after a model-specific failure.
        if is_default and ctx.model_specific:
            pass
        elif is_default or not listed:
            return R.SAME_PROVIDER
        elif not ctx.model_specific:
            return R.SIBLING_NOT_FOR_KIND
    elif provider == ctx.default_provider and not is_default and not listed:
        return R.SAME_PROVIDER  # never chosen automatically as a backup of the default
    # R-SEL-3, R-SEL-5 with chains (shared with reserve)
    return confinement_reason(ctx.policy, key, ctx.default, ctx.tried)


def _active_cooldowns(
    snapshot: Snapshot, rows: tuple[ActiveCooldown, ...] | None = None
) -> tuple[dict[str, int], dict[str, int]]:
    """The latest end of the still active cooldowns (or `rows`), per provider and per model key."""
    providers: dict[str, int] = {}
    models: dict[str, int] = {}
    now, provider_scope = snapshot.now_ms, CooldownScope.PROVIDER
    for c in snapshot.cooldowns if rows is None else rows:
        until = c.until_ms
        if until > now:
            ends = providers if c.scope == provider_scope else models
            if until > ends.get(c.target, until - 1):
                ends[c.target] = until
    return providers, models


def select(
    catalog: Catalog, policy: Policy, snapshot: Snapshot, request: SelectionRequest
) -> Selection:
    """Ordered eligible routes (default first, R-SEL-2) and every other model with its reason."""
    default = request.default_model
    index = _index(catalog, request_kind(catalog, policy, default))
    tried = request.tried | ({request.failed_model} if request.failed_model else frozenset())
    primaries = expand(policy, default) if default is not None else frozenset()
    allowed = allowlist(policy, default, tried)
    ctx = _Context(
        policy=policy,
        default=default,
        primaries=primaries,
        listed=allowed or frozenset(),
        model_specific=request.after_failure in MODEL_SPECIFIC_KINDS,
        failed_provider=_provider_of(request.failed_model) if request.failed_model else None,
        default_provider=(
            _provider_of(default) if default and not is_pool_key(default) else None
        ),
        tried=tried,
    )
    fresh = request.after_failure is None  # the default of a fresh request skips fallback rules
    # For a model of any other provider than the failed and the default one, and not the default
    # itself, the fallback rules reduce to R-SEL-3/R-SEL-5 (`_fallback_reason`'s last two checks).
    special = frozenset(p for p in (ctx.failed_provider, ctx.default_provider) if p is not None)
    confined = not policy.cross_provider_fallback
    listed = allowed
    available = snapshot.available_providers
    no_base_url = catalog.providers_without_base_url()
    denied = _denied(index, policy)
    provider_cooling, model_cooling = _active_cooldowns(snapshot)
    provider_probing, model_probing = _active_cooldowns(snapshot, snapshot.probing)
    used = snapshot.source_models
    models_full = len(used) + 1 > policy.source_models  # R-RES-7: no room for a new model
    price_needed = policy.daily_estimated_usd is not None
    tokens = request.input_tokens
    first: list[_Entry] = []  # the default model when eligible (R-SEL-2)
    backups: list[_Entry] = []
    excluded: list[Exclusion] = []
    frees_at: list[tuple[int, _Entry]] = []  # (cooldown end, model) of models only cooling
    limits = _input_limits(index, policy.reply_tokens)
    # A whole provider run is decided at once when no rule needs to look at its models one by
    # one: its provider is available, has a base URL, is neither the failed nor the default one
    # and is not cooling or probing, and none of its keys is denied, tried, a primary, cooling
    # or probing. The remaining rules are per-catalog data of the run. Any other run goes through
    # the rules model by model; both ways give the same result.
    # R-TOK-4: models a token window or a learned limit has no room for, like cooling ones
    no_room = (
        exclusions(snapshot.tokens, catalog, snapshot.now_ms,
                   tokens_for_bytes(request.input_bytes), policy.reply_tokens)
        if snapshot.tokens else {}
    )  # fmt: skip
    singled = denied | tried | primaries | model_cooling.keys() | model_probing.keys()
    if no_room:
        singled |= no_room.keys()
    for group, group_limit in zip(
        index.groups, _group_limits(index, policy.reply_tokens), strict=True
    ):
        provider = group.provider
        if (
            provider in available
            and provider not in no_base_url
            and provider not in special
            and provider not in provider_cooling
            and provider not in provider_probing
            and group.keys.isdisjoint(singled)
        ):
            if confined or (listed is not None and group.keys.isdisjoint(listed)):
                excluded += group.outside  # R-SEL-1, then R-SEL-3/R-SEL-5
                continue
            if (
                listed is None
                and not models_full
                and (group_limit is None or tokens <= group_limit)
                and (group.price_known or not price_needed)
            ):
                excluded += group.no_text  # R-SEL-1; the text models are all eligible
                backups += group.text
                continue
        first_at = group.start
        for entry, limit in zip(
            group.entries, limits[first_at : first_at + len(group.entries)], strict=True
        ):
            key, provider = entry.key, entry.provider
            early: ExclusionReason | None = None
            if provider not in available:
                early = R.UNAVAILABLE
            elif provider in no_base_url:
                early = R.NO_BASE_URL
            elif not entry.text_capable:
                early = entry.out
            elif key in denied:
                early = R.DENIED_BY_ROUTE
            elif key in tried:
                early = R.ALREADY_TRIED
            elif provider in special or key in primaries:
                if not fresh or key not in primaries:
                    early = _fallback_reason(ctx, key, provider)
            elif confined or (listed is not None and key not in listed):
                early = R.NOT_IN_FALLBACK_LIST  # R-SEL-3, R-SEL-5 (as confinement_reason)
            if early is not None:
                excluded.append(entry.excluded(early))
                continue
            late: ExclusionReason | None = None
            if models_full and key not in used:
                late = R.SOURCE_MODELS
            elif limit is not None and tokens > limit:
                late = R.CONTEXT_TOO_SMALL
            elif price_needed and not entry.price_known:
                late = R.UNKNOWN_PRICE
            provider_until = provider_cooling.get(provider)
            model_until = model_cooling.get(key)
            if provider_until is not None:
                reason = R.PROVIDER_COOLDOWN
                until = provider_until if model_until is None else max(provider_until, model_until)
            elif model_until is not None:
                reason, until = R.MODEL_COOLDOWN, model_until
            elif provider in provider_probing or key in model_probing:
                # the probe frees the target when it settles, at the latest at its deadline
                reason = R.PROBING
                until = max(provider_probing.get(provider, 0), model_probing.get(key, 0))
            elif key in no_room:  # R-TOK-4: room again when the window frees or the limit resets
                reason, room_at = no_room[key]
                if room_at is None:
                    excluded.append(entry.excluded(reason))
                    continue
                until = room_at
            elif late is not None:
                excluded.append(entry.excluded(late))
                continue
            else:
                (first if key in primaries else backups).append(entry)
                continue
            excluded.append(entry.cooling(reason, until))
            if late is None:  # excluded only by cooldowns: it frees when they end
                frees_at.append((until, entry))
    match, order = cascade(policy, default, tried)
    routes, pools = _ordered(catalog, policy, request, first, backups, excluded, match, order)
    return Selection(
        routes=routes,
        excluded=tuple(excluded),
        retry_at_ms=_retry_at(
            ((snapshot.now_ms, e) for e in first + backups) if routes else frees_at,
            snapshot,
            policy,
            request,
        ),
        chain=match,
        pools=pools,
    )


def _ordered(
    catalog: Catalog,
    policy: Policy,
    request: SelectionRequest,
    first: list[_Entry],
    backups: list[_Entry],
    excluded: list[Exclusion],
    match: ChainMatch,
    order: tuple[Target, ...],
) -> tuple[tuple[str, ...], tuple[PoolView, ...]]:
    """The routes in order: the default (or its pool) first (R-SEL-2), then the cascaded chain's
    entries in order (R-RT-1; a pool entry once, as its pool key), else every eligible backup in
    R-SEL-6 order. Also the state of every pool route considered (R-RT-5)."""
    default = request.default_model
    routes: list[str] = []
    views: list[PoolView] = []
    covered: set[str] = set()
    reasons: dict[str, Exclusion] | None = None
    eligible: set[str] = set()  # filled on first use: only pools and chains look keys up

    def add_pool(key: str, effort: Effort | None) -> None:
        nonlocal reasons
        if reasons is None:
            reasons = {e.model: e for e in excluded}
            if not eligible:
                eligible.update([e.key for e in first], [e.key for e in backups])
        members = pool_members(policy, key)
        views.append(pool_view(policy, catalog, key, eligible, reasons))
        if any(m.key in eligible and m.key not in covered for m in members):
            routes.append(Route(key, effort))
            covered.update(m.key for m in members)

    if default is not None and is_pool_key(default):
        add_pool(default, request.default_effort)
    elif first:
        effort = request.default_effort
        routes.append(first[0].route if effort is None else Route(first[0].key, effort))
        covered.add(first[0].key)
    if match.complete:
        if not eligible:
            eligible.update([e.key for e in first], [e.key for e in backups])
        placed = {default}
        for target in order:
            if target.key in placed:
                continue
            placed.add(target.key)
            if target.is_pool:
                add_pool(target.key, target.effort)
            elif target.key in eligible and target.key not in covered:
                routes.append(Route(target.key, target.effort))
                covered.add(target.key)
    else:
        backups.sort(key=_by_rank)
        routes += [e.route for e in backups if e.key not in covered]
    return tuple(routes), tuple(views)


def _retry_at(
    ready: Iterable[tuple[int, _Entry]],
    snapshot: Snapshot,
    policy: Policy,
    request: SelectionRequest,
) -> int | None:
    """R-SEL-10: when waiting yields a reservable route, or None if waiting does not help.

    `ready` holds the routes (ready now) or, with none, the models excluded only by cooldowns
    (ready when those end). Under a cost ceiling a model is ready only once the rolling 24 h cost
    leaves room for its estimate; then the shared hourly budget must also have a slot.
    """
    hourly = snapshot.hourly_next_free_ms
    window, now = snapshot.daily, snapshot.now_ms
    times: list[int] = []
    for at, entry in ready:
        if window is not None:
            estimate = estimate_micro(entry.model, request.input_bytes, policy.reply_tokens)
            room = None if estimate is None else ceiling_frees_at(at, window, estimate)
            if room is None:
                continue  # its estimate alone exceeds the ceiling: waiting does not help
            at = max(at, room)
        if at <= now:
            return hourly  # a route is reservable now, budget slot permitting (no need to look on)
        times.append(at)
    if not times:
        return None
    soonest = min(times)
    return soonest if hourly is None else max(soonest, hourly)
