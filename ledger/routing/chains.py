"""Fallback chains (R-RT-1): which chain a primary gets, how a failed backup cascades, and which
concrete models a chain admits (the privacy allowlist of R-SEL-5).

Pure functions of the (frozen) policy; results are memoised on the policy object, so selection
over hundreds of chains costs a dictionary lookup per primary after the first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledger.routing.globs import matches
from ledger.targets import Target, is_pool_key, split_effort, target_of

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


def _default(policy: Policy) -> ChainMatch:
    memo = policy._memo
    found = memo.get(DEFAULT_CHAIN)
    if isinstance(found, ChainMatch):
        return found
    if policy.default_chain is not None:
        entries = tuple(target_of(e) for e in policy.default_chain)
        found = ChainMatch(DEFAULT_CHAIN, None, "no chains key matched", entries)
    elif policy.fallback_models:
        entries = tuple(target_of(e) for e in policy.fallback_models)
        found = ChainMatch(FALLBACK_MODELS, None, "no chains key matched", entries)
    else:
        found = ChainMatch(None, None, "no chain: backups in price order (R-SEL-6)", ())
    memo[DEFAULT_CHAIN] = found
    return found


def _chains(policy: Policy) -> tuple[tuple[str, int, tuple[Target, ...]], ...]:
    """(key, literal characters, entries) of every chains key, in file order."""
    memo = policy._memo
    found = memo.get(CHAINS)
    if isinstance(found, tuple):
        return found
    found = tuple(
        (key, literal_chars(key), tuple(target_of(e) for e in chain))
        for key, chain in policy.chains.items()
    )
    memo[CHAINS] = found
    return found


def chain_for(policy: Policy, primary: str | None) -> ChainMatch:
    """The chain of a primary (a model or pool key, no effort): exact key, else the matching key
    with the most literal characters (ties: the earlier key), else defaultChain (R-RT-1)."""
    if primary is None or not policy.chains:
        return _default(policy)
    memo_key = ("chain", primary)
    found = policy._memo.get(memo_key)
    if isinstance(found, ChainMatch):
        return found
    chains = _chains(policy)
    exact = next((c for c in chains if c[0] == primary), None)
    if exact is not None:
        found = ChainMatch(CHAINS, exact[0], "exact key", exact[2])
    else:
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
            found = _default(policy)
        else:
            why = f"most literal characters ({best[1]})"
            if tie:
                why += "; the earlier of equally literal keys"
            found = ChainMatch(CHAINS, best[0], why, best[2])
    if len(policy._memo) < 100_000:  # bounded: primaries come from policy and catalog
        policy._memo[memo_key] = found
    return found


def pool_members(policy: Policy, key: str) -> tuple[Target, ...]:
    """The concrete candidates of a pool key (nested pools flattened, in order), or the key."""
    if not is_pool_key(key):
        return (Target(key),)
    memo_key = ("members", key)
    found = policy._memo.get(memo_key)
    if isinstance(found, tuple):
        return found
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
    result = tuple(out)
    policy._memo[memo_key] = result
    return result


def expand(policy: Policy, key: str) -> frozenset[str]:
    """The concrete model keys a model or pool key stands for."""
    memo_key = ("expand", key)
    found = policy._memo.get(memo_key)
    if isinstance(found, frozenset):
        return found
    result = frozenset(t.key for t in pool_members(policy, key))
    if len(policy._memo) < 100_000:
        policy._memo[memo_key] = result
    return result


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
    memo_key = ("allow", primary, failed)
    memo = policy._memo
    if memo_key in memo:
        found = memo[memo_key]
        return found if isinstance(found, frozenset) else None
    match, order = cascade(policy, primary, failed)
    result: frozenset[str] | None = None
    if match.complete:
        keys: set[str] = set()
        for target in order:
            keys |= expand(policy, target.key)
        result = frozenset(keys)
    if len(memo) < 100_000:  # bounded: primaries and tried sets come from policy and catalog
        memo[memo_key] = result
    return result


def primary_key(text: str | None) -> str | None:
    """The key of a primary target (its `:LEVEL` suffix, if any, removed)."""
    return None if text is None else split_effort(text)[0]
