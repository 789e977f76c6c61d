"""Route targets (R-RT-2): a model key, a pool key (`pool/NAME`), or a model key with an effort.

A `:LEVEL` suffix whose LEVEL is one of `EFFORT_LEVELS` means the same as an `effort` field; any
other suffix is part of the model id (`openrouter/fusion:xxs` stays as written). An effort belongs
to its route only: a route without one gets the provider's default, never the primary's effort.
"""


from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

POOL_PROVIDER = "pool"
"""The reserved provider name of pool keys (`pool/NAME`, R-RT-4)."""
POOL_PREFIX = POOL_PROVIDER + "/"


class Effort(StrEnum):
    """The reasoning-effort levels a route may carry (R-RT-2)."""

    NONE = "none"
    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"
    MAX = "max"


EFFORT_LEVELS = tuple(e.value for e in Effort)


@dataclass(frozen=True, slots=True)
class Target:
    """One route target: `key` is a model key or a pool key; `effort` None means none asked."""

    key: str
    effort: Effort | None = None

    @property
    def is_pool(self) -> bool:
        """Whether this names a pool (`pool/NAME`)."""
        return self.key.startswith(POOL_PREFIX)

    @property
    def pool_name(self) -> str | None:
        """The pool's NAME, or None for a model key."""
        return self.key[len(POOL_PREFIX) :] if self.is_pool else None

    def __str__(self) -> str:
        return self.key if self.effort is None else f"{self.key}:{self.effort}"


def split_effort(text: str) -> tuple[str, Effort | None]:
    """`provider/model:high` -> (`provider/model`, high); an unlisted suffix stays in the key."""
    head, sep, tail = text.rpartition(":")
    if sep and head and tail in EFFORT_LEVELS and "/" in head:
        return head, Effort(tail)
    return text, None


def parse_target(text: str, effort: str | Effort | None = None) -> Target:
    """A target from a key (maybe with a `:LEVEL` suffix) and an optional explicit effort.

    An explicit effort and a suffix together are ambiguous: the explicit one must not also be
    given as a suffix (ValueError with a fixed rule text).
    """
    key, suffix = split_effort(text)
    if suffix is not None and effort is not None:
        raise ValueError("rule: give the effort either as `effort` or as a `:LEVEL` suffix")
    chosen = suffix if effort is None else Effort(effort)
    return Target(key, chosen)


def pool_key(name: str) -> str:
    """`pool/NAME`."""
    return POOL_PREFIX + name


def is_pool_key(key: str) -> bool:
    """Whether a key names a pool."""
    return key.startswith(POOL_PREFIX)


class _Pool(Protocol):
    @property
    def candidates(self) -> Sequence[object]: ...


class Routing(Protocol):
    """The routing fields of a policy (`ledger.config.Policy` has them): what these rules read,
    named here so this module does not import the config that calls it."""

    @property
    def default_model(self) -> object | None: ...
    @property
    def fallback_models(self) -> Sequence[object]: ...
    @property
    def default_chain(self) -> Sequence[object] | None: ...
    @property
    def chains(self) -> Mapping[str, Sequence[object]]: ...
    @property
    def pools(self) -> Mapping[str, _Pool]: ...

KEY = "<key>"  # a user-chosen dictionary key is never printed (R-CFG-3)


def target_of(entry: object) -> Target:
    """The Target of one config entry (a key string, or a {model, effort} object)."""

    if isinstance(entry, str):
        return parse_target(entry)
    model = getattr(entry, "model")  # noqa: B009 - TargetSpec or CandidateSpec
    return parse_target(model, getattr(entry, "effort", None))


def entries(policy: Routing) -> Iterator[tuple[str, object]]:
    """Every target entry of the policy with its field path."""
    entry: object
    if policy.default_model is not None:
        yield "defaultModel", policy.default_model
    for i, entry in enumerate(policy.fallback_models):
        yield f"fallbackModels[{i}]", entry
    for i, entry in enumerate(policy.default_chain or ()):
        yield f"defaultChain[{i}]", entry
    for chain in policy.chains.values():
        for i, entry in enumerate(chain):
            yield f"chains.{KEY}[{i}]", entry
    for pool in policy.pools.values():
        for i, entry in enumerate(pool.candidates):
            yield f"pools.{KEY}.candidates[{i}]", entry


def routing_problem(policy: Routing) -> tuple[str, str] | None:
    """The first routing rule the policy breaks, as (field path, rule), or None."""
    if policy.fallback_models and policy.default_chain is not None:
        return "defaultChain", "must not be set together with fallbackModels (they are one list)"
    for path, entry in entries(policy):
        try:
            target = target_of(entry)
        except ValueError as exc:
            return path, str(exc).split("rule: ", 1)[-1]
        name = target.pool_name
        if name is not None and name not in policy.pools:
            return path, "names a pool that is not in `pools`"
    lists: list[tuple[str, list[object]]] = [("defaultChain", list(policy.default_chain or ()))]
    lists += [(f"chains.{KEY}", list(c)) for c in policy.chains.values()]
    lists += [(f"pools.{KEY}.candidates", list(p.candidates)) for p in policy.pools.values()]
    for path, items in lists:
        keys = [target_of(e).key for e in items]
        if len(set(keys)) != len(keys):
            return path, "must not contain duplicate entries"
    cycle = _pool_cycle(policy)
    if cycle:
        return f"pools.{KEY}.candidates", "pools must not contain themselves (a cycle)"
    return None


def _pool_cycle(policy: Routing) -> bool:
    """Whether pools nest in a cycle (R-RT-4)."""
    children = {
        name: [t.pool_name for t in map(target_of, spec.candidates) if t.is_pool]
        for name, spec in policy.pools.items()
    }
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(name: str) -> bool:
        mark = state.get(name)
        if mark == 1:
            return True
        if mark == 2:
            return False
        state[name] = 1
        if any(child is not None and visit(child) for child in children.get(name, ())):
            return True
        state[name] = 2
        return False

    return any(visit(name) for name in children)
