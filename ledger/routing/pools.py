"""Pools (R-RT-4..6): candidates behind one virtual model, chosen by a strategy, kept by a sticky
lease. Pure: the store reads the cursor, the lease and the hour's usage inside the reserve's write
transaction, asks `try_order` in which order to try the candidates, and grants the first one every
check admits (R-RT-5).

Strategies are data (`STRATEGIES`): each orders one tier's candidates from the pool's state; tiers
come first (tier 0 before 1), so a lower tier is used only while no higher one is eligible.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledger.clock import iso
from ledger.routing.chains import expand, pool_members
from ledger.targets import Effort, target_of
from ledger.validation import Slot

if TYPE_CHECKING:
    from ledger.catalog import Catalog
    from ledger.config import Policy, PoolSpec
    from ledger.routing.exclusion import Exclusion

DEFAULT_CACHE_TTL_S: Mapping[str, int] = {
    "openai-chat": 300, "anthropic-messages": 300, "openai-responses": 300
}
"""Prompt-cache lifetime per API when the catalog model has no `promptCacheTtlS` (R-RT-6): both
APIs keep a cached prefix about five minutes after its last use."""
FALLBACK_CACHE_TTL_S = 300


@dataclass(frozen=True, slots=True)
class Candidate:
    """One direct candidate of a pool: its key (a model or a nested pool), tier, effort, index."""

    key: str
    tier: int
    effort: Effort | None
    index: int

    @property
    def is_pool(self) -> bool:
        """A nested pool."""
        return self.key.startswith("pool/")


_CANDIDATES: Slot[str, tuple[Candidate, ...]] = Slot("direct candidates of a pool")


def leads_to(policy: Policy, cand: Candidate, model_key: str) -> bool:
    """Whether choosing `cand` can give `model_key`: it is that model, or a nested pool holding
    it at any depth (R-RT-6: a sticky lease names the concrete model)."""
    if not cand.is_pool:
        return cand.key == model_key
    return any(m.key == model_key for m in pool_members(policy, cand.key))


def spec_of(policy: Policy, pool: str) -> PoolSpec:
    """The pool's spec (a pool key or a bare name); KeyError when unknown."""
    return policy.pools[pool.removeprefix("pool/")]


def candidates(policy: Policy, pool: str) -> tuple[Candidate, ...]:
    """The pool's direct candidates in list order."""
    return policy.derived.value(_CANDIDATES, pool, lambda: _make_candidates(policy, pool))


def _make_candidates(policy: Policy, pool: str) -> tuple[Candidate, ...]:
    spec = spec_of(policy, pool)
    out = []
    for i, entry in enumerate(spec.candidates):
        target = target_of(entry)
        out.append(Candidate(target.key, int(getattr(entry, "tier", 0)), target.effort, i))
    return tuple(out)


@dataclass(frozen=True)
class PoolState:
    """What a strategy reads: the cursor (index of the last round-robin pick), the seed of a
    random draw, and the reservations each candidate model had in the rolling hour."""

    cursor: int | None = None
    seed: int = 0
    usage: Mapping[str, int] | None = None


def _primary(cands: list[Candidate], state: PoolState, n: int) -> list[Candidate]:
    return cands


def _round_robin(cands: list[Candidate], state: PoolState, n: int) -> list[Candidate]:
    start = -1 if state.cursor is None else state.cursor
    return sorted(cands, key=lambda c: (c.index - start - 1) % n)


def _random(cands: list[Candidate], state: PoolState, n: int) -> list[Candidate]:
    shuffled = list(cands)
    random.Random(state.seed).shuffle(shuffled)
    return shuffled


def _least_used(cands: list[Candidate], state: PoolState, n: int) -> list[Candidate]:
    usage = state.usage or {}
    return sorted(cands, key=lambda c: (usage.get(c.key, 0), c.index))


STRATEGIES: Mapping[str, Callable[[list[Candidate], PoolState, int], list[Candidate]]] = {
    "primary": _primary,
    "round-robin": _round_robin,
    "random": _random,
    "least-used": _least_used,
}


def try_order(
    strategy: str, cands: tuple[Candidate, ...], state: PoolState
) -> list[Candidate]:
    """The order to try candidates in: tier by tier, each tier in the strategy's order."""
    order: list[Candidate] = []
    n = len(cands)
    for tier in sorted({c.tier for c in cands}):
        order += STRATEGIES[strategy]([c for c in cands if c.tier == tier], state, n)
    return order


def random_seed(source_id: str, now_ms: int, sequence: int) -> int:
    """The seed of a `random` pool's draw: the reservation's own identity (its source, creation
    time and place in the rolling hour), so `simulate` reproduces it."""
    digest = hashlib.sha256(f"{source_id}\x00{now_ms}\x00{sequence}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def sticky_until(
    sticky: object, chosen_ms: int, success_ms: int | None, ttl_ms: int
) -> int | None:
    """Until when a sticky lease holds (R-RT-6), None when it holds without end (`on`), or -1
    when it does not hold (`off`, or no success yet where one is needed).

    `on`: until the candidate fails or cools (the lease is then deleted); `{"for": D}`: D after
    it was first chosen; `while-cached`: the prompt-cache lifetime after its last success.
    """
    if sticky == "off" or success_ms is None:
        return -1
    if sticky == "on":
        return None
    if sticky == "while-cached":
        return success_ms + ttl_ms
    duration = getattr(sticky, "ms", None)
    return -1 if duration is None else chosen_ms + int(duration)


def holds(sticky: object, chosen_ms: int, success_ms: int | None, ttl_ms: int, now: int) -> bool:
    """Whether a lease is live at `now`."""
    until = sticky_until(sticky, chosen_ms, success_ms, ttl_ms)
    return until is None or until > now


def cache_ttl_ms(catalog: Catalog, model_key: str) -> int:
    """The model's prompt-cache lifetime: catalog `promptCacheTtlS`, else the API's default."""
    model = catalog.model(model_key)
    if model is None:
        return FALLBACK_CACHE_TTL_S * 1000
    if model.prompt_cache_ttl_s is not None:
        return model.prompt_cache_ttl_s * 1000
    provider = catalog.providers.get(model.provider)
    api = provider.api if provider is not None else ""
    return DEFAULT_CACHE_TTL_S.get(api, FALLBACK_CACHE_TTL_S) * 1000


def sticky_text(sticky: object) -> str:
    """`off`, `on`, `while-cached` or `for 30m`."""
    duration = getattr(sticky, "for_", None)
    return f"for {duration}" if duration is not None else str(sticky)


@dataclass(frozen=True)
class CandidateView:
    """One candidate as selection or status sees it: eligible, or the reason it is skipped."""

    key: str
    tier: int
    effort: Effort | None
    state: str  # "eligible" or an exclusion reason code
    until_ms: int | None = None

    @property
    def is_pool(self) -> bool:
        """A nested pool."""
        return self.key.startswith("pool/")

    def to_json(self) -> dict[str, object]:
        """JSON shape."""
        return {
            "model": self.key,
            "tier": self.tier,
            "effort": self.effort,
            "state": self.state,
            "until": iso(self.until_ms),
        }


@dataclass(frozen=True)
class Lease:
    """A live sticky lease: the pool, its scope (a source id, or '' for the whole pool), the
    candidate, and until when it holds (None: until it fails or cools)."""

    pool: str
    scope: str
    model: str
    until_ms: int | None

    def to_json(self) -> dict[str, object]:
        """JSON shape (the scope is a source id, which status shows anyway)."""
        return {
            "scope": self.scope or "pool",
            "model": self.model,
            "until": iso(self.until_ms),
        }


@dataclass(frozen=True)
class PoolView:
    """A pool's strategy, stickiness, cursor and candidates with state (R-RT-5, R-RT-7)."""

    name: str
    strategy: str
    sticky: str
    sticky_scope: str
    candidates: tuple[CandidateView, ...]
    cursor: int | None = None
    leases: tuple[Lease, ...] = ()

    def to_json(self) -> dict[str, object]:
        """JSON shape used by `select --json`, `pool show --json` and `status --json`."""
        return {
            "pool": self.name,
            "strategy": self.strategy,
            "sticky": self.sticky,
            "sticky_scope": self.sticky_scope,
            "cursor": self.cursor,
            "candidates": [c.to_json() for c in self.candidates],
            "leases": [lease.to_json() for lease in self.leases],
        }


def pool_view(
    policy: Policy,
    catalog: Catalog,
    key: str,
    eligible: frozenset[str] | set[str],
    reasons: Mapping[str, Exclusion],
) -> PoolView:
    """A pool's candidates with their state from one selection: eligible, or their exclusion
    (a nested pool is eligible when any of its members is)."""
    spec = spec_of(policy, key)
    views = []
    for cand in candidates(policy, key):
        if cand.is_pool:
            ok = not expand(policy, cand.key).isdisjoint(eligible)
            state = "eligible" if ok else "no_candidate"
            views.append(CandidateView(cand.key, cand.tier, cand.effort, state))
            continue
        exclusion = reasons.get(cand.key)
        if cand.key in eligible:
            state, until = "eligible", None
        elif exclusion is not None:
            state, until = str(exclusion.reason), exclusion.until_ms
        else:
            state = "not_in_catalog" if catalog.model(cand.key) is None else "covered"
            until = None
        views.append(CandidateView(cand.key, cand.tier, cand.effort, state, until))
    return PoolView(
        name=key.removeprefix("pool/"),
        strategy=spec.strategy,
        sticky=sticky_text(spec.sticky),
        sticky_scope=spec.sticky_scope,
        candidates=tuple(views),
    )
