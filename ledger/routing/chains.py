"""Fallback chains (R-RT-1): which chain a primary gets, how a failed backup cascades, and which
concrete models a chain admits (the privacy allowlist of R-SEL-5).

Pure functions of the (frozen) policy; results are memoised on the policy object, so selection
over hundreds of chains costs a dictionary lookup per primary after the first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledger.globs import matches
from ledger.targets import Target, is_pool_key, split_effort, target_of
from ledger.validation import Slot

if TYPE_CHECKING:
    from ledger.config import Policy

DEFAULT_CHAIN = "defaultChain"
FALLBACK_MODELS = "fallbackModels"
CHAINS = "chains"


@dataclass(frozen=True)
class ChainMatch:
    """The chain a primary resolved to and why.

    `field` is `chains`, `defaultChain`, `fallbackModels` or None (no list: R-SEL-6 order);
    `key` the matching chains key (a glob) when `field` is `chains`; `complete` whether the list
    is the complete backup list (a matched chain always is; an empty default list is not).
    """

    field: str | None
    key: str | None
    why: str
    entries: tuple[Target, ...]

    @property
    def complete(self) -> bool:
        """The list confines the backups (R-SEL-5)."""
        return self.field == CHAINS or bool(self.entries)

    def to_json(self) -> dict[str, object]:
        """`{field, key, why, entries}` (keys and entries are the operator's own policy text)."""
        return {
            "field": self.field,
            "key": self.key,
            "why": self.why,
            "entries": [str(t) for t in self.entries],
        }


def literal_chars(pattern: str) -> int:
    """Non-wildcard characters of an anchored glob (R-RT-1's 'most literal')."""
    return len(pattern) - pattern.count("*") - pattern.count("?")


_DEFAULT: Slot[None, ChainMatch] = Slot("the default chain")
_CHAINS: Slot[None, tuple[tuple[str, int, tuple[Target, ...]], ...]] = Slot("chains keys")
_CHAIN_FOR: Slot[str, ChainMatch] = Slot("chain of a primary", bounded=True)
_MEMBERS: Slot[str, tuple[Target, ...]] = Slot("pool members")
_EXPAND: Slot[str, frozenset[str]] = Slot("model keys of a key", bounded=True)
_ALLOW: Slot[tuple[str | None, frozenset[str]], frozenset[str] | None] = Slot(
    "allowlist", bounded=True  # bounded: primaries and tried sets come from policy and catalog
)


def _default(policy: Policy) -> ChainMatch:
    return policy.derived.value(_DEFAULT, None, lambda: _make_default(policy))


def _make_default(policy: Policy) -> ChainMatch:
    if policy.default_chain is not None:
        entries = tuple(target_of(e) for e in policy.default_chain)
        return ChainMatch(DEFAULT_CHAIN, None, "no chains key matched", entries)
    if policy.fallback_models:
        entries = tuple(target_of(e) for e in policy.fallback_models)
        return ChainMatch(FALLBACK_MODELS, None, "no chains key matched", entries)
    return ChainMatch(None, None, "no chain: backups in price order (R-SEL-6)", ())


def _chains(policy: Policy) -> tuple[tuple[str, int, tuple[Target, ...]], ...]:
    """(key, literal characters, entries) of every chains key, in file order."""
    return policy.derived.value(
        _CHAINS,
        None,
        lambda: tuple(
            (key, literal_chars(key), tuple(target_of(e) for e in chain))
            for key, chain in policy.chains.items()
        ),
    )


def chain_for(policy: Policy, primary: str | None) -> ChainMatch:
    """The chain of a primary (a model or pool key, no effort): exact key, else the matching key
    with the most literal characters (ties: the earlier key), else defaultChain (R-RT-1)."""
    if primary is None or not policy.chains:
        return _default(policy)
    return policy.derived.value(_CHAIN_FOR, primary, lambda: _make_chain(policy, primary))


def _make_chain(policy: Policy, primary: str) -> ChainMatch:
    chains = _chains(policy)
    exact = next((c for c in chains if c[0] == primary), None)
    if exact is not None:
        return ChainMatch(CHAINS, exact[0], "exact key", exact[2])
    best: tuple[str, int, tuple[Target, ...]] | None = None
    tie = False
    for chain in chains:
        if not matches(primary, chain[0]):
            continue
        if best is None or chain[1] > best[1]:
            best, tie = chain, False
        elif chain[1] == best[1]:
            tie = True
    if best is None:
        return _default(policy)
    why = f"most literal characters ({best[1]})"
    if tie:
        why += "; the earlier of equally literal keys"
    return ChainMatch(CHAINS, best[0], why, best[2])


def pool_members(policy: Policy, key: str) -> tuple[Target, ...]:
    """The concrete candidates of a pool key (nested pools flattened, in order), or the key."""
    if not is_pool_key(key):
        return (Target(key),)
    return policy.derived.value(_MEMBERS, key, lambda: _make_members(policy, key))


def _make_members(policy: Policy, key: str) -> tuple[Target, ...]:
    out: list[Target] = []
    seen: set[str] = set()
    spec = policy.pools.get(key[len("pool/") :])
    if spec is not None:
        for entry in spec.candidates:
            target = target_of(entry)
            for member in pool_members(policy, target.key) if target.is_pool else (target,):
                if member.key not in seen:
                    seen.add(member.key)
                    out.append(member)
    return tuple(out)


def expand(policy: Policy, key: str) -> frozenset[str]:
    """The concrete model keys a model or pool key stands for."""
    return policy.derived.value(
        _EXPAND, key, lambda: frozenset(t.key for t in pool_members(policy, key))
    )


def cascade(
    policy: Policy, primary: str | None, tried: Iterable[str]
) -> tuple[ChainMatch, tuple[Target, ...]]:
    """The primary's chain and the ordered backup list after the failures in `tried` (R-RT-1).

    When a backup from the list was tried (it failed), the entries not yet tried keep their
    order and that backup's own chain is appended behind them, without duplicates. A pool entry
    cascades through the chain of each of its candidates that was tried.
    """
    match = chain_for(policy, primary)
    failed = frozenset(tried)
    if not match.complete or not failed:
        return match, match.entries
    order = list(match.entries)
    seen = {t.key for t in order}
    if primary is not None:
        seen.add(primary)
    i = 0
    while i < len(order):
        entry = order[i]
        i += 1
        hits = sorted(expand(policy, entry.key) & failed) if entry.is_pool else (
            [entry.key] if entry.key in failed else []
        )
        for hit in hits:
            for follow in chain_for(policy, hit).entries:
                if follow.key not in seen:
                    seen.add(follow.key)
                    order.append(follow)
    return match, tuple(order)


def allowlist(
    policy: Policy, primary: str | None, tried: Iterable[str] = ()
) -> frozenset[str] | None:
    """The concrete model keys the primary's (cascaded) chain admits as backups, or None when no
    list confines them (R-SEL-5 with R-RT-1)."""
    failed = frozenset(tried)
    return policy.derived.value(
        _ALLOW, (primary, failed), lambda: _make_allowlist(policy, primary, failed)
    )


def _make_allowlist(
    policy: Policy, primary: str | None, failed: frozenset[str]
) -> frozenset[str] | None:
    match, order = cascade(policy, primary, failed)
    if not match.complete:
        return None
    keys: set[str] = set()
    for target in order:
        keys |= expand(policy, target.key)
    return frozenset(keys)


def primary_key(text: str | None) -> str | None:
    """The key of a primary target (its `:LEVEL` suffix, if any, removed)."""
    return None if text is None else split_effort(text)[0]
