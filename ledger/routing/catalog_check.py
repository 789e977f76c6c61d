"""Routing rules that need the catalog (R-RT-3): an effort on a model the catalog marks
`"reasoning": false` is a config error; on a model whose flag is unknown (`null`) it is sent and
`config validate` warns. Paths name fields, indices and `<key>` only, never a value."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.errors import ConfigError
from ledger.routing.chains import pool_members
from ledger.routing.check import entries, target_of
from ledger.routing.targets import Effort


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
    """Raise ConfigError for an effort on a model the catalog marks non-reasoning (exit 2)."""
    for path, key in _efforts(policy):
        model = catalog.model(key)
        if model is not None and model.reasoning is False:
            raise ConfigError(file, path, "an effort needs a model the catalog marks reasoning")


def effort_warnings(policy: Policy, catalog: Catalog) -> list[EffortWarning]:
    """Efforts on models whose reasoning flag is unknown."""
    found = []
    for path, key in _efforts(policy):
        model = catalog.model(key)
        if model is not None and model.reasoning is None:
            found.append(EffortWarning(path))
    return found
