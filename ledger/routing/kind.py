"""The kind of request a route serves (R-FMT-3): chat, or embeddings. A request of one kind
never lands on a model of the other; selection, the gateway and the models list ask here."""

from __future__ import annotations

from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.routing.chains import pool_members


def request_kind(catalog: Catalog, policy: Policy, default: str | None) -> str:
    """The kind of request a selection serves: the requested model's (a pool's candidates'),
    chat when none is named or known (R-FMT-3)."""
    if default is None:
        return "chat"
    kinds = {
        model.serves
        for member in pool_members(policy, default)
        if (model := catalog.model(member.key)) is not None
    }
    return kinds.pop() if len(kinds) == 1 else "chat"
