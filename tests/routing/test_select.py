"""The pure selector (SPEC section 9): one test per rule, a scenario table, and invariants."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.budgets.unit import Stage, Use, token_budgets, token_target
from ledger.catalog import Catalog
from ledger.config import Policy, TokenLimits
from ledger.kinds import CooldownScope, ExclusionReason, FailureKind
from ledger.learned import LimitKind
from ledger.routing.exclusion import Exclusion
from ledger.routing.room import LearnedRoom, TokenRoom
from ledger.routing.select import (
    RULE_ORDER,
    Selection,
    SelectionRequest,
    Snapshot,
    fallback_order,
    select,
)
from ledger.tokens import estimate_tokens
from tests.support.selection import (
    AVAILABLE,
    CATALOG,
    MIN,
    MODELS,
    NOW,
    catalog_of,
    cooldown,
    price,
    snap,
)

R = ExclusionReason


# Three providers with siblings, a reasoning model, unknown and zero prices, a tiny window,
# an image-only model and a provider that is not available.
NOURL: dict[str, Any] = {"provider": "nourl", "id": "x", "pricing": price(0.01, 0.01)}
EMBED: dict[str, Any] = {"provider": "vectors", "id": "e", "kind": "embedding",
                         "pricing": price(0.01, 0.01)}  # fmt: skip
KEYS = [m.key for m in CATALOG.models]
(ANTHROPIC_TPM,) = token_budgets(token_target("anthropic"), TokenLimits(tokens_per_minute=1000),
                                 Stage.TOKENS)  # fmt: skip


def run(
    policy: dict[str, Any] | None = None,
    snapshot: Snapshot | None = None,
    catalog: Catalog = CATALOG,
    **request: Any,
) -> Selection:
    request.setdefault("default_model", "openai/gpt-a")
    return select(
        catalog,
        Policy.model_validate(policy or {}),
        snapshot or snap(),
        SelectionRequest(**request),
    )


def reasons(selection: Selection) -> dict[str, ExclusionReason]:
    return {e.model: e.reason for e in selection.excluded}


def assert_partition(selection: Selection, catalog: Catalog = CATALOG) -> None:
    names = list(selection.routes) + [e.model for e in selection.excluded]
    assert sorted(names) == sorted(m.key for m in catalog.models)


# --- one row per rule -----------------------------------------------------------------------

RULES: list[tuple[str, dict[str, Any], str, ExclusionReason]] = [
    ("issue13-item1", {"catalog": catalog_of([*MODELS, NOURL]),
                       "snapshot": snap(available_providers=AVAILABLE | {"nourl"})},
     "nourl/x", R.NO_BASE_URL),
    ("R-CAT-2", {}, "offline/x", R.UNAVAILABLE),
    ("R-SEL-1", {}, "vision/img", R.NO_TEXT),
    ("R-FMT-3", {"catalog": catalog_of([*MODELS, EMBED]),
                 "snapshot": snap(available_providers=AVAILABLE | {"vectors"})},
     "vectors/e", R.MODEL_KIND),
    ("R-FMT-3-chat", {"catalog": catalog_of([*MODELS, EMBED]), "default_model": "vectors/e",
                      "snapshot": snap(available_providers=AVAILABLE | {"vectors"})},
     "openai/gpt-a", R.MODEL_KIND),
    ("R-SEL-9", {"policy": {"routes": {"deny": ["anthropic/*"]}}}, "anthropic/claude-h",
     R.DENIED_BY_ROUTE),
    ("R-SEL-9-allow", {"policy": {"routes": {"allow": ["openai/*"]}}}, "local/llama",
     R.DENIED_BY_ROUTE),
    ("tried", {"tried": frozenset({"anthropic/claude-h"})}, "anthropic/claude-h", R.ALREADY_TRIED),
    ("tried-failed", {"after_failure": FailureKind.RATE_LIMIT, "failed_model": "openai/gpt-a"},
     "openai/gpt-a", R.ALREADY_TRIED),
    ("R-SEL-4-fresh", {}, "openai/gpt-b", R.SAME_PROVIDER),
    ("R-SEL-4-failed", {"default_model": "anthropic/claude-h", "after_failure": FailureKind.AUTH,
                        "failed_model": "openai/gpt-a"}, "openai/gpt-b", R.SAME_PROVIDER),
    ("R-SEL-4-kind", {"policy": {"fallbackModels": ["openai/gpt-b"]},
                      "after_failure": FailureKind.QUOTA, "failed_model": "openai/gpt-a"},
     "openai/gpt-b", R.SIBLING_NOT_FOR_KIND),
    ("R-SEL-5", {"policy": {"fallbackModels": ["local/llama"]}}, "anthropic/claude-h",
     R.NOT_IN_FALLBACK_LIST),
    ("R-SEL-3", {"policy": {"crossProviderFallback": False}}, "anthropic/claude-h",
     R.NOT_IN_FALLBACK_LIST),
    ("R-SEL-7-provider", {"snapshot": snap(cooldowns=(
        cooldown(CooldownScope.PROVIDER, "anthropic", NOW + MIN),))}, "anthropic/claude-h",
     R.PROVIDER_COOLDOWN),
    ("R-SEL-7-model", {"snapshot": snap(cooldowns=(
        cooldown(CooldownScope.MODEL, "anthropic/claude-h", NOW + MIN),))}, "anthropic/claude-h",
     R.MODEL_COOLDOWN),
    ("R-SEL-7-probing-model", {"snapshot": snap(probing=(
        cooldown(CooldownScope.MODEL, "anthropic/claude-h", NOW + MIN),))}, "anthropic/claude-h",
     R.PROBING),
    ("R-SEL-7-probing-provider", {"snapshot": snap(probing=(
        cooldown(CooldownScope.PROVIDER, "anthropic", NOW + MIN),))}, "anthropic/claude-h",
     R.PROBING),
    ("R-TOK-4-window", {"snapshot": snap(tokens=TokenRoom(windows=(
        (ANTHROPIC_TPM, Use(900, ((NOW + MIN, 900),))),)))}, "anthropic/claude-h",
     R.TOKEN_BUDGET),
    ("R-TOK-4-learned", {"snapshot": snap(tokens=TokenRoom(learned=(
        LearnedRoom("anthropic/claude-h", LimitKind.TOKENS, 100, NOW + MIN),)))},
     "anthropic/claude-h", R.PROVIDER_TOKENS_EXHAUSTED),
    ("R-RES-7", {"snapshot": snap(source_models=frozenset({"openai/gpt-a", "local/llama"}))},
     "anthropic/claude-h", R.SOURCE_MODELS),
    ("R-SEL-8", {"input_tokens": 7000}, "local/llama", R.CONTEXT_TOO_SMALL),
    ("R-RES-2", {"policy": {"dailyEstimatedUsd": 5}}, "local/llama", R.UNKNOWN_PRICE),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "args", "model", "reason"), RULES, ids=[row[0] for row in RULES])
def test_rule_excludes_with_its_reason(
    rule: str, args: dict[str, Any], model: str, reason: ExclusionReason
) -> None:
    selection = run(**args)
    assert reasons(selection)[model] is reason
    assert model not in selection.routes
    assert_partition(selection, args.get("catalog", CATALOG))


def test_every_reason_code_has_a_place_in_the_rule_order() -> None:
    assert sorted(RULE_ORDER) == sorted(ExclusionReason)
    assert {row[3] for row in RULES} == set(ExclusionReason)


# --- R-SEL-2 / R-SEL-6 / R-SEL-5 order ----------------------------------------------------


def test_r_sel_2_default_first_even_when_expensive() -> None:
    selection = run(default_model="anthropic/claude-s")
    assert selection.routes[0] == "anthropic/claude-s"


def test_r_sel_6_order_without_a_list() -> None:
    # gpt-a first (default); gpt-b is its sibling; claude-h (6) before claude-s (18, reasoning);
    # unknown (llama) and zero (free) prices after known ones, then by key
    assert run().routes == ("openai/gpt-a", "anthropic/claude-h", "anthropic/claude-s",
                            "local/free", "local/llama")  # fmt: skip


def test_r_sel_6_reasoning_after_non_reasoning_at_equal_price() -> None:
    models: list[dict[str, Any]] = [
        {"provider": "a", "id": "think", "reasoning": True, "pricing": price(1, 1)},
        {"provider": "b", "id": "plain", "pricing": price(1, 1)},
        {"provider": "c", "id": "cheap", "reasoning": True, "pricing": price(0.5, 0.5)},
        {"provider": "d", "id": "half-zero", "pricing": price(0, 0.1)},
    ]
    catalog = catalog_of(models)
    selection = run(catalog=catalog, default_model=None, snapshot=snap(
        available_providers=frozenset("abcd")))  # fmt: skip
    assert selection.routes == ("c/cheap", "b/plain", "a/think", "d/half-zero")


def test_r_sel_5_list_order_is_priority_and_unavailable_entries_are_skipped() -> None:
    policy = {"fallbackModels": ["local/llama", "offline/x", "anthropic/claude-s"]}
    selection = run(policy)
    assert selection.routes == ("openai/gpt-a", "local/llama", "anthropic/claude-s")
    assert reasons(selection)["offline/x"] is R.UNAVAILABLE


def test_r_sel_5_listed_sibling_follows_a_model_specific_failure() -> None:
    policy = {"fallbackModels": ["openai/gpt-b", "anthropic/claude-h"]}
    for kind in (FailureKind.RATE_LIMIT, FailureKind.INVALID_OUTPUT, FailureKind.REQUEST_REJECTED):
        selection = run(policy, after_failure=kind, failed_model="openai/gpt-a")
        assert selection.routes == ("openai/gpt-b", "anthropic/claude-h")
    for kind in (FailureKind.AUTH, FailureKind.QUOTA, FailureKind.TRANSPORT):
        selection = run(policy, after_failure=kind, failed_model="openai/gpt-a")
        assert selection.routes == ("anthropic/claude-h",)
        assert reasons(selection)["openai/gpt-b"] is R.SIBLING_NOT_FOR_KIND


@pytest.mark.parametrize("kind", [FailureKind.AUTH, FailureKind.QUOTA, FailureKind.TRANSPORT])
def test_r_sel_4_default_is_not_offered_after_its_sibling_failed_for_the_provider(
    kind: FailureKind,
) -> None:
    selection = run(after_failure=kind, failed_model="openai/gpt-b")
    assert reasons(selection)["openai/gpt-a"] is R.SAME_PROVIDER
    assert not [r for r in selection.routes if r.startswith("openai/")]


def test_r_sel_4_default_may_follow_a_model_specific_failure_of_its_sibling() -> None:
    selection = run(after_failure=FailureKind.RATE_LIMIT, failed_model="openai/gpt-b")
    assert selection.routes[0] == "openai/gpt-a"


def test_r_sel_3_cross_provider_false_confines_to_default() -> None:
    policy = {"crossProviderFallback": False, "fallbackModels": ["anthropic/claude-h"]}
    assert run(policy).routes == ("openai/gpt-a",)
    failed = run(policy, after_failure=FailureKind.RATE_LIMIT, failed_model="openai/gpt-a")
    assert failed.routes == ()
    assert failed.retry_at_ms is None


def test_r_sel_3_without_a_default_nothing_is_eligible() -> None:
    selection = run({"crossProviderFallback": False}, default_model=None)
    assert selection.routes == ()
    assert reasons(selection)["anthropic/claude-h"] is R.NOT_IN_FALLBACK_LIST


def test_fallback_order_is_exposed_for_status() -> None:
    policy = Policy.model_validate({"fallbackModels": ["local/llama"]})
    ordered = fallback_order(CATALOG, policy, CATALOG.models[:5])
    assert [m.key for m in ordered] == [
        "local/llama", "openai/gpt-b", "openai/gpt-a", "anthropic/claude-h", "anthropic/claude-s",
    ]  # fmt: skip


# --- R-SEL-7 cooldown details ---------------------------------------------------------------


def test_r_pol_2_model_cooldown_blocks_only_that_model() -> None:
    selection = run(
        snapshot=snap(cooldowns=(cooldown(CooldownScope.MODEL, "openai/gpt-a", NOW + 1),))
    )
    assert selection.routes[0] == "anthropic/claude-h"
    assert Exclusion("openai/gpt-a", R.MODEL_COOLDOWN, NOW + 1) in selection.excluded


def test_r_sel_7_expired_cooldowns_are_ignored() -> None:
    selection = run(snapshot=snap(cooldowns=(cooldown(CooldownScope.PROVIDER, "openai", NOW),)))
    assert selection.routes[0] == "openai/gpt-a"


def test_r_sel_7_cooldown_until_is_when_the_model_stops_cooling() -> None:
    cooldowns = (
        cooldown(CooldownScope.PROVIDER, "openai", NOW + MIN),
        cooldown(CooldownScope.MODEL, "openai/gpt-a", NOW + 5 * MIN),
    )
    selection = run(snapshot=snap(cooldowns=cooldowns))
    assert Exclusion("openai/gpt-a", R.PROVIDER_COOLDOWN, NOW + 5 * MIN) in selection.excluded


def test_r_pol_2_a_shorter_cooldown_never_shortens_a_longer_one() -> None:
    cooldowns = (
        cooldown(CooldownScope.MODEL, "openai/gpt-a", NOW + 5 * MIN),
        cooldown(CooldownScope.MODEL, "openai/gpt-a", NOW + MIN),
    )
    selection = run(snapshot=snap(cooldowns=cooldowns))
    assert Exclusion("openai/gpt-a", R.MODEL_COOLDOWN, NOW + 5 * MIN) in selection.excluded


# --- R-SEL-10 retry_at ------------------------------------------------------------------------


def _all_cooling(**kw: Any) -> Snapshot:
    cooldowns = (
        cooldown(CooldownScope.PROVIDER, "openai", NOW + 10 * MIN),
        cooldown(CooldownScope.MODEL, "anthropic/claude-h", NOW + 3 * MIN),
        cooldown(CooldownScope.MODEL, "anthropic/claude-s", NOW + 7 * MIN),
        cooldown(CooldownScope.PROVIDER, "local", NOW + 2 * MIN),
    )
    return snap(cooldowns=cooldowns, **kw)


def test_r_sel_10_retry_at_is_the_soonest_cooldown_end() -> None:
    selection = run(snapshot=_all_cooling())
    assert selection.routes == ()
    assert selection.retry_at_ms == NOW + 2 * MIN


def test_r_sel_10_a_cooling_model_that_would_still_be_excluded_does_not_count() -> None:
    # local models are too small for this request, so they free nothing at NOW + 2 min
    selection = run(snapshot=_all_cooling(), input_tokens=7000)
    assert reasons(selection)["local/llama"] is R.PROVIDER_COOLDOWN  # first rule wins
    assert selection.retry_at_ms == NOW + 3 * MIN


def test_r_sel_10_budget_slot_later_than_cooldown() -> None:
    selection = run(snapshot=_all_cooling(hourly_next_free_ms=NOW + 30 * MIN))
    assert selection.retry_at_ms == NOW + 30 * MIN


def test_r_sel_10_budget_slot_earlier_than_cooldown() -> None:
    selection = run(snapshot=_all_cooling(hourly_next_free_ms=NOW + MIN))
    assert selection.retry_at_ms == NOW + 2 * MIN


def test_r_sel_10_routes_listed_while_budget_full() -> None:
    selection = run(snapshot=snap(hourly_next_free_ms=NOW + 30 * MIN))
    assert selection.routes[0] == "openai/gpt-a"
    assert selection.retry_at_ms == NOW + 30 * MIN


def test_r_sel_10_none_when_waiting_cannot_help() -> None:
    selection = run(
        {"routes": {"allow": ["nothing/*"]}}, snapshot=snap(hourly_next_free_ms=NOW + 1)
    )
    assert selection.routes == ()
    assert selection.retry_at_ms is None


def test_r_sel_10_to_json() -> None:
    selection = run(snapshot=_all_cooling())
    data = selection.to_json()
    assert data["routes"] == []
    assert data["retry_at"] == "2023-11-14T22:15:20.000Z"
    assert {"model": "offline/x", "reason": "unavailable"} in data["excluded"]  # type: ignore[operator]
    assert set(data) == {"routes", "excluded", "excluded_by_reason", "retry_at", "chain", "targets"}


# --- scenario table ---------------------------------------------------------------------------

CJK_TEXT = "日本語の文章" * 1100  # 6600 tokens; the same number of ASCII characters is 2200
SCENARIOS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("fresh default, R-SEL-6 backups", {},
     ("openai/gpt-a", "anthropic/claude-h", "anthropic/claude-s", "local/free", "local/llama")),
    ("no default: cheapest first", {"default_model": None},
     ("openai/gpt-b", "openai/gpt-a", "anthropic/claude-h", "anthropic/claude-s", "local/free",
      "local/llama")),
    ("unknown default is ignored", {"default_model": "nope/none"},
     ("openai/gpt-b", "openai/gpt-a", "anthropic/claude-h", "anthropic/claude-s", "local/free",
      "local/llama")),
    ("auth on openai: no openai at all",
     {"after_failure": FailureKind.AUTH, "failed_model": "openai/gpt-a"},
     ("anthropic/claude-h", "anthropic/claude-s", "local/free", "local/llama")),
    ("rate limit on default, sibling not listed",
     {"after_failure": FailureKind.RATE_LIMIT, "failed_model": "openai/gpt-a"},
     ("anthropic/claude-h", "anthropic/claude-s", "local/free", "local/llama")),
    ("CJK input too big for the local window", {"input_tokens": estimate_tokens(CJK_TEXT)},
     ("openai/gpt-a", "anthropic/claude-h", "anthropic/claude-s")),
    ("same length in ASCII fits", {"input_tokens": estimate_tokens("a" * len(CJK_TEXT))},
     ("openai/gpt-a", "anthropic/claude-h", "anthropic/claude-s", "local/free", "local/llama")),
    ("request rejected, backup must fit",
     {"after_failure": FailureKind.REQUEST_REJECTED, "failed_model": "openai/gpt-a",
      "input_tokens": 150_000},
     ("anthropic/claude-h", "anthropic/claude-s")),
    ("daily ceiling drops unknown and zero prices (issue 12 item 11)",
     {"policy": {"dailyEstimatedUsd": 1}},
     ("openai/gpt-a", "anthropic/claude-h", "anthropic/claude-s")),
    ("source already used two models",
     {"snapshot": snap(source_models=frozenset({"openai/gpt-a", "anthropic/claude-s"})),
      "after_failure": FailureKind.INVALID_OUTPUT, "failed_model": "openai/gpt-a"},
     ("anthropic/claude-s",)),
    ("allowlisted single provider: sibling after rate limit",
     {"policy": {"fallbackModels": ["openai/gpt-b"]},
      "snapshot": snap(available_providers=frozenset({"openai"})),
      "after_failure": FailureKind.RATE_LIMIT, "failed_model": "openai/gpt-a"},
     ("openai/gpt-b",)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "args", "routes"), SCENARIOS, ids=[row[0] for row in SCENARIOS])
def test_scenarios(name: str, args: dict[str, Any], routes: tuple[str, ...]) -> None:
    selection = run(**args)
    assert selection.routes == routes
    assert_partition(selection)


# --- invariants -------------------------------------------------------------------------------

PROVIDERS = ["p0", "p1", "p2"]


@st.composite
def model_dicts(draw: st.DrawFn) -> list[dict[str, Any]]:
    keys = draw(
        st.lists(st.tuples(st.sampled_from(PROVIDERS), st.sampled_from("abcdef")), unique=True,
                 min_size=1, max_size=10)
    )  # fmt: skip
    out: list[dict[str, Any]] = []
    for provider, model_id in keys:
        data: dict[str, Any] = {"provider": provider, "id": model_id}
        data["reasoning"] = draw(st.booleans())
        if draw(st.booleans()):
            data["pricing"] = price(
                draw(st.sampled_from([None, 0, 0.5, 1, 2])), draw(st.sampled_from([None, 0, 1, 3]))
            )
        if draw(st.booleans()):
            data["contextWindow"] = draw(st.sampled_from([1000, 5000, 100_000]))
            data["maxOutputTokens"] = draw(st.sampled_from([100, 1000, 5000]))
        if draw(st.integers(0, 9)) == 0:
            data["output"] = ["image"]
        out.append(data)
    return out


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Catalog, Policy, Snapshot, SelectionRequest]:
    models = draw(model_dicts())
    catalog = catalog_of(models)
    keys = [m.key for m in catalog.models]
    maybe_key = st.one_of(st.none(), st.sampled_from(keys))
    policy = Policy.model_validate(
        {
            "crossProviderFallback": draw(st.booleans()),
            "fallbackModels": draw(st.lists(st.sampled_from(keys), unique=True, max_size=3)),
            "sourceModels": draw(st.integers(1, 3)),
            "routes": {"deny": draw(st.lists(st.sampled_from(["p2/*", "*a", "p?/b"]), max_size=1))},
            "dailyEstimatedUsd": draw(st.sampled_from([None, 1.0])),
        }
    )
    targets = st.one_of(
        st.tuples(st.just(CooldownScope.PROVIDER), st.sampled_from(PROVIDERS)),
        st.tuples(st.just(CooldownScope.MODEL), st.sampled_from(keys)),
    )
    cooldowns = tuple(
        cooldown(scope, target, NOW + draw(st.integers(-MIN, 10 * MIN)))
        for scope, target in draw(st.lists(targets, max_size=4))
    )
    snapshot = Snapshot(
        now_ms=NOW,
        available_providers=frozenset(draw(st.lists(st.sampled_from(PROVIDERS)))),
        cooldowns=cooldowns,
        source_models=frozenset(draw(st.lists(st.sampled_from(keys), max_size=2))),
        hourly_next_free_ms=draw(st.one_of(st.none(), st.integers(NOW + 1, NOW + 60 * MIN))),
    )
    failed = draw(maybe_key)
    request = SelectionRequest(
        default_model=draw(maybe_key),
        input_tokens=draw(st.sampled_from([0, 800, 3000, 50_000])),
        after_failure=draw(st.sampled_from([None, *FailureKind])) if failed else None,
        failed_model=failed,
        tried=frozenset(draw(st.lists(st.sampled_from(keys), max_size=2))),
    )
    return catalog, policy, snapshot, request


@settings(max_examples=200)
@given(worlds(), st.randoms(use_true_random=False))
def test_r_sel_6_order_is_total_and_independent_of_catalog_order(
    world: tuple[Catalog, Policy, Snapshot, SelectionRequest], rnd: random.Random
) -> None:
    catalog, policy, snapshot, request = world
    shuffled = catalog.model_dump(by_alias=True)
    rnd.shuffle(shuffled["models"])
    again = select(Catalog.model_validate(shuffled), policy, snapshot, request)
    assert again == select(catalog, policy, snapshot, request)


@settings(max_examples=200)
@given(worlds())
def test_r_sel_7_every_model_appears_exactly_once(
    world: tuple[Catalog, Policy, Snapshot, SelectionRequest],
) -> None:
    selection = select(*world)
    assert_partition(selection, world[0])


@settings(max_examples=200)
@given(worlds())
def test_r_sel_2_default_first_whenever_eligible(
    world: tuple[Catalog, Policy, Snapshot, SelectionRequest],
) -> None:
    catalog, policy, snapshot, request = world
    selection = select(*world)
    default = request.default_model
    if default is not None and default in selection.routes:
        assert selection.routes[0] == default
    # eligibility of the default does not depend on which other models exist
    if default is not None:
        alone = catalog_of(
            [m.model_dump(by_alias=True) for m in catalog.models if m.key == default]
        )
        assert (default in select(alone, policy, snapshot, request).routes) is (
            default in selection.routes
        )


@settings(max_examples=200)
@given(worlds(), st.sampled_from([FailureKind.AUTH, FailureKind.QUOTA]))
def test_r_sel_4_no_model_of_a_provider_that_failed_auth_or_quota(
    world: tuple[Catalog, Policy, Snapshot, SelectionRequest], kind: FailureKind
) -> None:
    catalog, policy, snapshot, request = world
    failed = request.failed_model or catalog.models[0].key
    after = SelectionRequest(
        default_model=request.default_model,
        input_tokens=request.input_tokens,
        after_failure=kind,
        failed_model=failed,
        tried=request.tried,
    )
    selection = select(catalog, policy, snapshot, after)
    provider = failed.partition("/")[0]
    assert all(not route.startswith(provider + "/") for route in selection.routes)


@settings(max_examples=200)
@given(worlds())
def test_r_sel_5_routes_stay_inside_the_list_and_in_its_order(
    world: tuple[Catalog, Policy, Snapshot, SelectionRequest],
) -> None:
    _, policy, _, request = world
    selection = select(*world)
    backups = [r for r in selection.routes if r != request.default_model]
    if policy.fallback_models:
        assert backups == [k for k in policy.fallback_models if k in backups]
    if not policy.cross_provider_fallback:
        assert backups == []
    assert not set(selection.routes) & (request.tried | {request.failed_model})


@settings(max_examples=200)
@given(worlds())
def test_r_sel_10_retry_at_only_when_waiting_helps(
    world: tuple[Catalog, Policy, Snapshot, SelectionRequest],
) -> None:
    _, _, snapshot, _ = world
    selection = select(*world)
    if selection.routes:
        assert selection.retry_at_ms == snapshot.hourly_next_free_ms
        return
    if selection.retry_at_ms is None:
        return
    assert selection.retry_at_ms > snapshot.now_ms
    # at retry_at the cooldowns that end by then are gone and the budget slot is free
    later = Snapshot(
        now_ms=selection.retry_at_ms,
        available_providers=snapshot.available_providers,
        cooldowns=snapshot.cooldowns,
        source_models=snapshot.source_models,
    )
    assert select(world[0], world[1], later, world[3]).routes


def test_issue12_item11_under_a_ceiling_only_billed_false_makes_a_zero_price_free() -> None:
    policy = Policy.model_validate({"dailyEstimatedUsd": 1, "defaultModel": "openai/gpt-a"})
    models: list[dict[str, Any]] = [
        {"provider": "openai", "id": "gpt-a", "pricing": price(0.4, 1.6)},
        {"provider": "paid", "id": "zero", "pricing": price(0, 0)},
        {"provider": "paid", "id": "half", "pricing": price(0, 1)},
        {"provider": "own", "id": "gpu", "billed": False},
        {"provider": "own", "id": "gpu-zero", "billed": False, "pricing": price(0, 0)},
    ]
    catalog = catalog_of(models)
    available = frozenset({"openai", "paid", "own"})
    snapshot = snap(available_providers=available)
    got = select(catalog, policy, snapshot, SelectionRequest("openai/gpt-a"))
    assert got.routes == ("openai/gpt-a", "own/gpu", "own/gpu-zero")
    reasons = {e.model: e.reason for e in got.excluded}
    assert reasons == {"paid/zero": R.UNKNOWN_PRICE, "paid/half": R.UNKNOWN_PRICE}


def test_r_sel_8_r_res_2_a_provider_run_with_mixed_models_is_decided_per_model() -> None:
    """Issue 30: a provider's run of models is decided at once only when every model in it gets
    the same answer; one too-small window or one unknown price among them still counts."""
    mixed = catalog_of([
        *MODELS,
        {"provider": "wide", "id": "big", "contextWindow": 200_000, "pricing": price(1, 2)},
        {"provider": "wide", "id": "small", "contextWindow": 9_000, "pricing": price(1, 2)},
        {"provider": "wide", "id": "unpriced", "contextWindow": 200_000},
    ])  # fmt: skip
    available = snap(available_providers=AVAILABLE | {"wide"})
    selection = run(snapshot=available, catalog=mixed, input_tokens=20_000)
    assert reasons(selection)["wide/small"] == R.CONTEXT_TOO_SMALL
    assert {"wide/big", "wide/unpriced"} <= set(selection.routes)
    assert_partition(selection, mixed)
    priced = run({"dailyEstimatedUsd": 5}, available, mixed, input_tokens=100)
    assert reasons(priced)["wide/unpriced"] == R.UNKNOWN_PRICE
    assert "wide/big" in priced.routes
    assert "wide/small" in priced.routes
