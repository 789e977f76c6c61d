"""The selector's per-catalog caches (R-SEL-6, R-SEL-8, R-SEL-9): a catalog used for many selections
under changing policies selects exactly like a fresh copy of itself.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.kinds import CooldownScope
from ledger.routing.select import SelectionRequest, fallback_order, select
from ledger.store.views import CooldownEnd
from tests.support.selection import CATALOG, MIN, MODELS, NOW, cooldown, snap

KEYS = [m.key for m in CATALOG.models]

policies = st.builds(
    lambda reply, deny, allow, listed, ceiling: Policy.model_validate(
        {
            "replyTokens": reply,
            "routes": {"deny": deny, "allow": allow},
            "fallbackModels": listed,
            "dailyEstimatedUsd": ceiling,
        }
    ),
    st.sampled_from([1, 2048, 4096, 100_000]),
    st.lists(st.sampled_from(["openai/*", "*h", "local/?????"]), max_size=2),
    st.lists(st.sampled_from(["*", "anthropic/*", "local/*"]), max_size=2),
    st.lists(st.sampled_from(KEYS), unique=True, max_size=3),
    st.sampled_from([None, 5.0]),
)
requests = st.builds(
    SelectionRequest,
    default_model=st.one_of(st.none(), st.sampled_from(KEYS)),
    input_tokens=st.sampled_from([0, 5000, 7000, 120_000]),
)


def fresh_copy(catalog: Catalog) -> Catalog:
    """The same catalog parsed again: no cached state."""
    return Catalog.model_validate(catalog.model_dump(by_alias=True))


@settings(max_examples=100)
@given(st.lists(st.tuples(policies, requests), min_size=2, max_size=6))
def test_r_sel_8_r_sel_9_cached_catalog_selects_like_a_fresh_one(
    rounds: list[tuple[Policy, SelectionRequest]],
) -> None:
    catalog = fresh_copy(CATALOG)  # one object, reused under every policy below
    for policy, request in rounds:
        expected = select(fresh_copy(catalog), policy, snap(), request)
        assert select(catalog, policy, snap(), request) == expected


def test_r_sel_6_fallback_order_of_a_cached_catalog_matches_a_fresh_one() -> None:
    catalog = fresh_copy(CATALOG)
    policy = Policy()
    select(catalog, policy, snap(), SelectionRequest(default_model=None))
    copy = fresh_copy(catalog)
    expected = [m.key for m in fallback_order(copy, policy, copy.models)]
    assert [m.key for m in fallback_order(catalog, policy, catalog.models)] == expected
    # models of another catalog are ordered by their own prices, not by a cached key
    cheap: list[dict[str, Any]] = [
        {**m, "pricing": [{"inputUsdPerMTok": 0.001, "outputUsdPerMTok": 0.001}]}
        if m["id"] == "claude-s"
        else m
        for m in MODELS
    ]
    other = Catalog.model_validate({"providers": catalog.to_json()["providers"], "models": cheap})
    assert fallback_order(catalog, policy, other.models)[0].key == "anthropic/claude-s"


def test_r_sel_1_a_copy_with_other_models_is_indexed_again() -> None:
    catalog = fresh_copy(CATALOG)
    request = SelectionRequest(default_model="openai/gpt-a")
    before = select(catalog, Policy(), snap(), request)
    fewer = catalog.model_copy(update={"models": catalog.models[:2]})
    after = select(fewer, Policy(), snap(), request)
    assert set(after.routes) | {e.model for e in after.excluded} == set(KEYS[:2])
    assert select(catalog, Policy(), snap(), request) == before


def test_r_sel_7_cooldown_ends_are_read_anew_on_every_call() -> None:
    catalog = fresh_copy(CATALOG)
    request = SelectionRequest(default_model="openai/gpt-a")
    seen: set[int | None] = set()
    for minutes in range(1, 20):  # more distinct ends than the per-model cache keeps
        end = NOW + minutes * MIN
        cooling = snap(cooldowns=(cooldown(CooldownScope.PROVIDER, "anthropic", end),))
        selection = select(catalog, Policy(), cooling, request)
        until = {e.until_ms for e in selection.excluded if e.model.startswith("anthropic/")}
        assert until == {end}
        seen |= until
    assert len(seen) == 19


def test_r_sel_7_snapshot_takes_the_stores_cooldown_ends() -> None:
    rows = (CooldownEnd(CooldownScope.MODEL, "anthropic/claude-h", NOW + MIN),)
    selection = select(CATALOG, Policy(), snap(cooldowns=rows), SelectionRequest(None))
    assert {e.model: e.until_ms for e in selection.excluded}["anthropic/claude-h"] == NOW + MIN
