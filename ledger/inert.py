"""Inert configuration entries (R-CFG-4) and a missing catalog: what would make a policy entry
do nothing, each with a reason code, for `config validate`, `worker run` and `status`.

Warnings name the field and the entry's position, never the entry's text.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum

from ledger.catalog import NO_CATALOG, Catalog, split_model_key
from ledger.config import Policy
from ledger.errors import ConfigError
from ledger.globs import glob_to_regex
from ledger.routing.chains import pool_members, primary_key
from ledger.targets import Effort, entries, is_pool_key, pool_key, target_of


class InertReason(StrEnum):
    """Why a policy entry matches no usable model."""

    UNKNOWN_PROVIDER = "unknown_provider"  # the key's provider is not in the catalog
    NOT_IN_CATALOG = "not_in_catalog"  # the provider is, this model id is not
    PROVIDER_UNAVAILABLE = "provider_unavailable"  # listed, but its provider is unavailable now
    NO_TEXT = "no_text"  # listed and available, but it does not take and give text
    MATCHES_NOTHING = "matches_nothing"  # a route rule that matches no catalog model at all
    NO_USABLE_CANDIDATE = "no_usable_candidate"  # a pool none of whose candidates is usable


_EXPLAINED = {
    InertReason.UNKNOWN_PROVIDER: "its provider is not in the catalog",
    InertReason.NOT_IN_CATALOG: "no catalog model has this id",
    InertReason.PROVIDER_UNAVAILABLE: "its provider is not available (credential variable unset)",
    InertReason.NO_TEXT: "the model does not take and produce text",
    InertReason.MATCHES_NOTHING: "the rule matches no catalog model",
    InertReason.NO_USABLE_CANDIDATE: "no candidate of the pool is usable",
}


@dataclass(frozen=True)
class InertEntry:
    """One policy entry that does nothing, by position (`fallbackModels[2]`), with its reason."""

    field: str
    reason: InertReason

    @property
    def message(self) -> str:
        """`fallbackModels[2]: not_in_catalog (no catalog model has this id); inert`."""
        return f"{self.field}: {self.reason} ({_EXPLAINED[self.reason]}); inert"

    def to_json(self) -> dict[str, str]:
        """JSON shape used by `config validate --json` and `status --json`."""
        return {"field": self.field, "reason": str(self.reason), "message": self.message}


def inert_entries(
    policy: Policy, catalog: Catalog, env: Mapping[str, str] | None = None
) -> list[InertEntry]:
    """Entries that match no available, text-capable catalog model, each with its reason."""
    available = catalog.available_providers(os.environ if env is None else env)
    found: list[InertEntry] = []
    keys = ([("defaultModel", policy.default_model)] if policy.default_model else []) + [
        (f"fallbackModels[{i}]", entry) for i, entry in enumerate(policy.fallback_models)
    ]
    for field, key in keys + _routing_keys(policy):
        reason = _target_reason(policy, key, catalog, available)
        if reason is not None:
            found.append(InertEntry(field, reason))
    for n, glob in enumerate(policy.chains, 1):  # R-RT-7: a chains key no primary can have
        pattern = glob_to_regex(glob)
        pooled = any(pattern.fullmatch(pool_key(name)) for name in policy.pools)
        if not pooled and not any(pattern.fullmatch(m.key) for m in catalog.models):
            found.append(InertEntry(f"chains.<key {n}>", InertReason.MATCHES_NOTHING))
    for name, rules in (("allow", policy.routes.allow), ("deny", policy.routes.deny)):
        for i, rule in enumerate(rules):
            pattern = glob_to_regex(rule)
            matched = [m for m in catalog.models if pattern.fullmatch(m.key)]
            if not matched:
                found.append(InertEntry(f"routes.{name}[{i}]", InertReason.MATCHES_NOTHING))
            elif not any(m.provider in available for m in matched):
                found.append(InertEntry(f"routes.{name}[{i}]", InertReason.PROVIDER_UNAVAILABLE))
            elif not any(m.provider in available and m.text_capable for m in matched):
                found.append(InertEntry(f"routes.{name}[{i}]", InertReason.NO_TEXT))
    return found


def _routing_keys(policy: Policy) -> list[tuple[str, str]]:
    """Every target of defaultChain, chains and pools with its field path (a chains key or pool
    name by its position, `<key 2>`, never by its text: R-CFG-3)."""
    out = [(f"defaultChain[{i}]", str(target_of(e).key))
           for i, e in enumerate(policy.default_chain or ())]  # fmt: skip
    for n, chain in enumerate(policy.chains.values(), 1):
        out += [(f"chains.<key {n}>[{i}]", target_of(e).key) for i, e in enumerate(chain)]
    for n, spec in enumerate(policy.pools.values(), 1):
        out += [(f"pools.<key {n}>.candidates[{i}]", target_of(e).key)
                for i, e in enumerate(spec.candidates)]  # fmt: skip
    return out


def _target_reason(
    policy: Policy, key: str, catalog: Catalog, available: frozenset[str]
) -> InertReason | None:
    """A model key's reason, or a pool key's: inert when none of its members is usable."""
    key = primary_key(key) or key
    if not is_pool_key(key):
        return _key_reason(key, catalog, available)
    reasons = [_key_reason(m.key, catalog, available) for m in pool_members(policy, key)]
    if not reasons or all(r is not None for r in reasons):
        return InertReason.NO_USABLE_CANDIDATE
    return None


def _key_reason(key: str, catalog: Catalog, available: frozenset[str]) -> InertReason | None:
    model = catalog.model(key)
    if model is None:
        provider = split_model_key(key)[0]
        known = provider in catalog.providers
        return InertReason.NOT_IN_CATALOG if known else InertReason.UNKNOWN_PROVIDER
    if model.provider not in available:
        return InertReason.PROVIDER_UNAVAILABLE
    if not model.text_capable:
        return InertReason.NO_TEXT
    return None


@dataclass(frozen=True)
class ConfigFindings:
    """What `config validate` warns about: no catalog models, inert policy entries."""

    no_catalog: bool = False
    inert: tuple[InertEntry, ...] = ()

    def warnings(self) -> list[str]:
        """One line each, the missing catalog first."""
        return ([NO_CATALOG] if self.no_catalog else []) + [e.message for e in self.inert]


def config_findings(
    policy: Policy, catalog: Catalog, env: Mapping[str, str] | None = None
) -> ConfigFindings:
    """The configuration warnings of this policy and catalog (env decides availability)."""
    return ConfigFindings(
        no_catalog=not catalog.models, inert=tuple(inert_entries(policy, catalog, env))
    )


# Routing rules that need the catalog (R-RT-3): an effort on a model the catalog marks
# `"reasoning": false` is a config error; on a model whose flag is unknown (`null`) it is sent and
# `config validate` warns. Paths name fields, indices and `<key>` only, never a value.


@dataclass(frozen=True)
class EffortWarning:
    """An effort on a model whose reasoning flag is unknown."""

    field: str

    @property
    def message(self) -> str:
        """One line for `config validate`."""
        return f"{self.field}: an effort on a model whose reasoning flag is unknown (sent anyway)"


def _efforts(policy: Policy) -> Iterator[tuple[str, str]]:
    """(path, concrete model key) of every entry that carries an effort."""
    for path, entry in entries(policy):
        target = target_of(entry)
        if target.effort is None or target.effort is Effort.NONE:
            continue  # `none` sends nothing: fine on any model
        for member in pool_members(policy, target.key) if target.is_pool else (target,):
            yield path, member.key


def check_routing(policy: Policy, catalog: Catalog, file: str) -> None:
    """Raise ConfigError for an effort on a model the catalog marks non-reasoning, or a chain or
    pool mixing chat and embedding models (exit 2)."""
    for path, key in _efforts(policy):
        model = catalog.model(key)
        if model is not None and model.reasoning is False:
            raise ConfigError(file, path, "an effort needs a model the catalog marks reasoning")
    check_kinds(policy, catalog, file)


MIXED_KINDS = "chat and embedding models never serve each other's requests (R-FMT-3)"


def _kinds(policy: Policy, catalog: Catalog, keys: Iterable[object]) -> set[str]:
    """The kinds of the catalog models among `keys` (pools expanded; unknown keys skipped)."""
    return {
        model.serves
        for key in keys
        for member in pool_members(policy, target_of(key).key)
        if (model := catalog.model(member.key)) is not None
    }


def check_kinds(policy: Policy, catalog: Catalog, file: str) -> None:
    """Raise ConfigError for a chain (with its primary) or a pool whose models are of more than
    one kind (R-FMT-3); paths name positions, never a key."""
    if not any(m.serves != "chat" for m in catalog.models):
        return  # a catalog of chat models alone mixes nothing
    def named(key: str | None) -> list[object]:  # a primary that names one model or pool
        return [key] if key and (is_pool_key(key) or catalog.model(key) is not None) else []

    chains: list[tuple[str, list[object]]] = [
        ("defaultChain", [*named(policy.default_model), *(policy.default_chain or ())])
    ]
    chains += [(f"chains.<key {n}>", [*named(glob), *chain])
               for n, (glob, chain) in enumerate(policy.chains.items(), 1)]  # fmt: skip
    chains += [(f"pools.<key {n}>", list(spec.candidates))
               for n, spec in enumerate(policy.pools.values(), 1)]  # fmt: skip
    for path, keys in chains:
        if len(_kinds(policy, catalog, keys)) > 1:
            raise ConfigError(file, path, MIXED_KINDS)


def effort_warnings(policy: Policy, catalog: Catalog) -> list[EffortWarning]:
    """Efforts on models whose reasoning flag is unknown."""
    found = []
    for path, key in _efforts(policy):
        model = catalog.model(key)
        if model is not None and model.reasoning is None:
            found.append(EffortWarning(path))
    return found
