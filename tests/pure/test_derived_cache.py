"""The typed cache a loaded policy and catalog own (issue 43): what routing, the API and the
gateway derive from a document is worked out once per document object, and a reloaded document (a
new object) starts with an empty cache: it never sees what was derived from the old one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.catalog import Catalog, load_catalog
from ledger.config import POLICY_FILE, Policy, load_policy
from ledger.routing import chains, select
from ledger.routing.chains import allowlist, chain_for, pool_members
from ledger.validation import DERIVED_BOUND, Derived, Slot

POLICY = {
    "chains": {"openai/*": ["anthropic/claude-h", "pool/cheap"]},
    "pools": {"cheap": {"candidates": ["local/small", "anthropic/claude-h"]}},
}
CATALOG = {
    "providers": {
        "openai": {"api": "openai-chat", "baseUrl": "https://openai.invalid/v1", "available": True},
        "anthropic": {"api": "anthropic-messages", "available": True},
        "nowhere": {"api": "openai-chat", "available": True},
    },
    "models": [
        {"provider": "openai", "id": "gpt-a"},
        {"provider": "anthropic", "id": "claude-h"},
    ],
}


def _counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[object]:
    """Replace module.name with a wrapper that records each call (each real computation)."""
    calls: list[object] = []
    real = getattr(module, name)

    def wrapper(*args: object) -> object:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / POLICY_FILE).write_text(json.dumps(POLICY))
    (tmp_path / "catalog.json").write_text(json.dumps(CATALOG))
    return tmp_path


def test_issue43_policy_values_are_computed_once_per_loaded_policy(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _counting(monkeypatch, chains, "_make_chain")
    policy = load_policy(home)
    first = chain_for(policy, "openai/gpt-a")
    assert chain_for(policy, "openai/gpt-a") is first
    assert chain_for(policy, "openai/gpt-a") is first
    assert len(made) == 1
    # the same file loaded again is a new policy: its own cache, computed again
    reloaded = load_policy(home)
    again = chain_for(reloaded, "openai/gpt-a")
    assert len(made) == 2
    assert again == first
    assert again is not first
    assert chain_for(policy, "openai/gpt-a") is first  # the old policy keeps its own
    assert len(made) == 2


def test_issue43_a_reloaded_policy_does_not_see_the_old_cache(home: Path) -> None:
    policy = load_policy(home)
    assert pool_members(policy, "pool/cheap")[0].key == "local/small"
    allowed = allowlist(policy, "openai/gpt-a")
    assert allowed == frozenset({"anthropic/claude-h", "local/small"})
    (home / POLICY_FILE).write_text(
        json.dumps({**POLICY, "pools": {"cheap": {"candidates": ["openai/gpt-a"]}}})
    )
    changed = load_policy(home)
    assert pool_members(changed, "pool/cheap")[0].key == "openai/gpt-a"
    assert allowlist(changed, "openai/gpt-a") == frozenset({"anthropic/claude-h", "openai/gpt-a"})
    assert allowlist(policy, "openai/gpt-a") is allowed


def test_issue43_catalog_values_are_computed_once_per_loaded_catalog(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    indexed = _counting(monkeypatch, select, "_make_index")
    catalog = load_catalog(home)
    missing = catalog.providers_without_base_url()
    assert missing == {"nowhere"}
    assert catalog.providers_without_base_url() is missing
    request = select.SelectionRequest(default_model="openai/gpt-a")
    policy = Policy()
    snap = select.Snapshot(now_ms=0, available_providers=frozenset(catalog.providers), cooldowns=())
    before = select.select(catalog, policy, snap, request)
    assert select.select(catalog, policy, snap, request) == before
    assert len(indexed) == 1
    reloaded = load_catalog(home)
    assert reloaded.providers_without_base_url() is not missing
    select.select(reloaded, policy, snap, request)
    assert len(indexed) == 2


def test_issue43_the_cache_keeps_one_value_per_slot_and_key() -> None:
    calls: list[int] = []
    slot: Slot[str, int] = Slot("a number")
    other: Slot[str, int] = Slot("another number")

    def make() -> int:
        calls.append(1)
        return len(calls)

    derived = Derived()
    assert derived.value(slot, "k", make) == 1
    assert derived.value(slot, "k", make) == 1
    assert derived.value(other, "k", make) == 2  # slots never share values
    assert derived.value(slot, "k", make, fresh=lambda v: v != 1) == 3  # stale: made again
    assert derived.value(slot, "k", make) == 3
    assert len(derived) == 2
    # a cache is no part of its document's value: equal documents stay equal after use
    assert Policy() == Policy()
    used = Policy()
    chain_for(used, None)
    assert used == Policy()


def test_issue43_bounded_slots_stop_keeping_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    derived = Derived()
    bounded: Slot[int, int] = Slot("request-keyed", bounded=True)
    kept: Slot[int, int] = Slot("document-keyed")
    for i in range(DERIVED_BOUND):
        derived.value(kept, i, lambda i=i: i)  # type: ignore[misc]
    calls: list[int] = []
    derived.value(bounded, 0, lambda: calls.append(0) or 0)  # type: ignore[func-returns-value]
    derived.value(bounded, 0, lambda: calls.append(0) or 0)  # type: ignore[func-returns-value]
    assert len(calls) == 2  # not kept: the cache is full
    assert derived.value(kept, -1, lambda: 7) == 7
    assert derived.value(kept, -1, lambda: 8) == 7  # unbounded slots keep on


def test_issue43_each_document_object_owns_its_cache() -> None:
    assert isinstance(Catalog().derived, Derived)
    assert isinstance(Policy().derived, Derived)
    assert Catalog().derived is not Catalog().derived
    assert Policy().derived is not Policy().derived
