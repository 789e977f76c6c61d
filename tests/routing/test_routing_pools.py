"""Pools (R-RT-4, R-RT-5) and stickiness (R-RT-6) through the real store on SQLite (and
PostgreSQL with LEDGER_TEST_PG_URL): the choice is made in the reserve's write transaction."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from ledger.classify import classify_kind
from ledger.errors import Refused
from ledger.kinds import CooldownScope, FailureKind
from ledger.records import Failed, Success
from ledger.store.pool_views import pool_state
from tests.support.backends import BACKENDS
from tests.support.ledgers import Clock
from tests.support.routing_fixtures import MEMBERS, RoutingFactory, routing_ledger

__all__ = ["routing_ledger"]

MIN = 60_000


def pool(strategy: str = "round-robin", **extra: Any) -> dict[str, Any]:
    return {"pools": {"p": {"candidates": list(MEMBERS), "strategy": strategy, **extra}}}


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_rt_5_round_robin_spreads_evenly_and_records_pool_and_model(
    routing_ledger: RoutingFactory,
) -> None:
    led = routing_ledger(**pool())
    got = [led.reserve(f"s{i}", "pool/p", input_bytes=10) for i in range(12)]
    assert [r.model for r in got[:4]] == MEMBERS  # the rotation starts at the first
    assert Counter(r.model for r in got) == dict.fromkeys(MEMBERS, 3)
    assert {r.pool for r in got} == {"p"}


def test_r_rt_5_a_cooling_candidate_is_skipped_and_the_rest_stay_even(
    routing_ledger: RoutingFactory,
) -> None:
    led = routing_ledger(**pool())
    led.store.set_cooldown(CooldownScope.PROVIDER, "acct2", 60 * MIN, None)
    got = Counter(led.reserve(f"s{i}", "pool/p", input_bytes=10).model for i in range(9))
    assert got == {"acct1/m": 3, "acct3/m": 3, "acct4/m": 3}


def test_r_rt_5_primary_takes_the_first_eligible_and_tiers_come_in_order(
    routing_ledger: RoutingFactory,
) -> None:
    cands = [{"model": "acct3/m", "tier": 1}, "acct1/m", {"model": "acct2/m", "tier": 0}]
    led = routing_ledger(pools={"p": {"candidates": cands, "strategy": "primary"}})
    assert led.reserve("s1", "pool/p", input_bytes=10).model == "acct1/m"
    led.store.set_cooldown(CooldownScope.PROVIDER, "acct1", 60 * MIN, None)
    assert led.reserve("s2", "pool/p", input_bytes=10).model == "acct2/m"
    led.store.set_cooldown(CooldownScope.PROVIDER, "acct2", 60 * MIN, None)
    assert led.reserve("s3", "pool/p", input_bytes=10).model == "acct3/m"  # tier 1 only now


def test_r_rt_5_least_used_takes_the_fewest_in_the_rolling_hour(
    routing_ledger: RoutingFactory,
) -> None:
    led = routing_ledger(**pool("least-used"))
    for i in range(3):
        led.reserve(f"x{i}", "acct1/m", input_bytes=10)
    led.reserve("y", "acct2/m", input_bytes=10)
    got = [led.reserve(f"s{i}", "pool/p", input_bytes=10).model for i in range(4)]
    assert got == ["acct3/m", "acct4/m", "acct2/m", "acct3/m"]  # ties: list order


def test_r_rt_5_random_is_drawn_from_the_reservation_and_reproducible(
    routing_ledger: RoutingFactory, clock: Clock
) -> None:
    from ledger.routing import pools

    led = routing_ledger(**pool("random"))
    got = led.reserve("s1", "pool/p", input_bytes=10)
    cands = pools.candidates(led.policy, "p")
    seed = pools.random_seed("s1", got.created_ms, 0)
    expected = pools.try_order("random", cands, pools.PoolState(seed=seed))[0].key
    assert got.model == expected


def test_r_rt_5_none_eligible_refuses_with_the_earliest_time_one_frees(
    routing_ledger: RoutingFactory, clock: Clock
) -> None:
    led = routing_ledger(**pool())
    for i, account in enumerate(("acct1", "acct2", "acct3", "acct4")):
        led.store.set_cooldown(CooldownScope.PROVIDER, account, (10 + i) * MIN, None)
    with pytest.raises(Refused) as refused:
        led.reserve("s1", "pool/p", input_bytes=10)
    assert refused.value.reason == "provider_cooldown"
    assert refused.value.retry_at_ms == clock.ms + 10 * MIN


def test_r_rt_5_request_id_replays_the_pool_reservation(routing_ledger: RoutingFactory) -> None:
    led = routing_ledger(**pool())
    first = led.reserve("s1", "pool/p", input_bytes=10, request_id="job-1")
    again = led.reserve("s1", "pool/p", input_bytes=10, request_id="job-1")
    assert again.replayed
    assert (again.id, again.model, again.pool) == (first.id, first.model, "p")


def test_r_rt_4_nested_pools_and_candidate_effort(routing_ledger: RoutingFactory) -> None:
    led = routing_ledger(
        pools={
            "inner": {"candidates": ["acct3/m", {"model": "acct4/m", "effort": "low"}],
                      "strategy": "round-robin"},
            "outer": {"candidates": [{"model": "pool/inner", "effort": "high"}, "acct1/m"],
                      "strategy": "primary"},
        }
    )  # fmt: skip
    a = led.reserve("s1", "pool/outer", input_bytes=10)
    b = led.reserve("s2", "pool/outer", input_bytes=10)
    assert (a.model, a.effort, a.pool) == ("acct3/m", "high", "outer")
    assert (b.model, b.effort) == ("acct4/m", "low")  # the candidate's own effort wins


def test_r_rt_4_pool_in_select_names_candidates_with_state(routing_ledger: RoutingFactory) -> None:
    led = routing_ledger(defaultModel="pool/p", **pool())
    led.store.set_cooldown(CooldownScope.MODEL, "acct2/m", 60 * MIN, None)
    sel = led.select("s1", input_bytes=10)
    assert sel.routes[0] == "pool/p"
    states = {c.key: c.state for c in sel.pools[0].candidates}
    assert states == {"acct1/m": "eligible", "acct2/m": "model_cooldown",
                      "acct3/m": "eligible", "acct4/m": "eligible"}  # fmt: skip
    assert "acct1/m" not in sel.routes  # the candidates are behind the pool route
    # a reserve with the route select returned goes through the pool
    assert led.reserve("s1", sel.routes[0], input_bytes=10).pool == "p"


def ok(led: Any, rid: int) -> None:
    led.settle(rid, Success(10, 10))


def fail(led: Any, rid: int) -> None:
    led.settle(rid, Failed(classify_kind(FailureKind.INVALID_OUTPUT, "json")))  # no cooldown


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_rt_6_sticky_on_keeps_the_candidate_that_succeeded_until_it_fails(
    routing_ledger: RoutingFactory,
) -> None:
    led = routing_ledger(**pool(sticky="on"))
    first = led.reserve("s1", "pool/p", input_bytes=10)
    ok(led, first.id)
    again = [led.reserve("s1", "pool/p", input_bytes=10) for _ in range(3)]
    assert {r.model for r in again} == {first.model}
    other = led.reserve("s2", "pool/p", input_bytes=10)  # per source: s2 rotates on
    assert other.model != first.model
    fail(led, again[0].id)  # a failure releases the lease
    assert led.reserve("s1", "pool/p", input_bytes=10).model != first.model


def test_r_rt_6_a_cooldown_releases_the_lease(routing_ledger: RoutingFactory) -> None:
    led = routing_ledger(**pool(sticky="on"))
    first = led.reserve("s1", "pool/p", input_bytes=10)
    ok(led, first.id)
    led.store.set_cooldown(CooldownScope.MODEL, first.model, 5 * MIN, None)
    moved = led.reserve("s1", "pool/p", input_bytes=10)
    assert moved.model != first.model
    led.store.clear_cooldown(CooldownScope.MODEL, first.model, True)
    assert led.reserve("s1", "pool/p", input_bytes=10).model != first.model  # released


def test_r_rt_6_while_cached_expires_at_the_ttl_after_the_last_success(
    routing_ledger: RoutingFactory, clock: Clock
) -> None:
    cands = ["claude/sonnet", "acct1/m"]  # sonnet: promptCacheTtlS 60 in the catalog
    led = routing_ledger(pools={"c": {"candidates": cands, "strategy": "round-robin",
                                      "sticky": "while-cached"}})  # fmt: skip
    first = led.reserve("s1", "pool/c", input_bytes=10)
    assert first.model == "claude/sonnet"
    ok(led, first.id)
    clock.advance(59_000)
    second = led.reserve("s1", "pool/c", input_bytes=10)
    assert second.model == "claude/sonnet"  # within 60 s of the last success
    ok(led, second.id)  # a success extends it
    clock.advance(59_000)
    third = led.reserve("s1", "pool/c", input_bytes=10)
    assert third.model == "claude/sonnet"
    clock.advance(61_000)  # no success since: the cache is cold
    assert led.reserve("s1", "pool/c", input_bytes=10).model == "acct1/m"


def test_r_rt_6_sticky_for_a_duration_after_first_chosen_and_pool_scope(
    routing_ledger: RoutingFactory, clock: Clock
) -> None:
    led = routing_ledger(**pool(sticky={"for": "2m"}, stickyScope="pool"))
    first = led.reserve("s1", "pool/p", input_bytes=10)
    ok(led, first.id)
    clock.advance(MIN)
    same = led.reserve("s2", "pool/p", input_bytes=10)  # scope pool: another source too
    assert same.model == first.model
    ok(led, same.id)  # success keeps when it was first chosen
    clock.advance(MIN + 1)
    assert led.reserve("s3", "pool/p", input_bytes=10).model != first.model


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_rt_6_a_sticky_pick_inside_a_nested_pool_is_kept(routing_ledger: RoutingFactory) -> None:
    """The outer pool's lease names the concrete model; the nested pool holding it goes first at
    the outer level and the model first inside it (the outer rotation would move on otherwise);
    a failure releases the lease as for a direct candidate."""
    led = routing_ledger(
        pools={
            "inner": {"candidates": ["acct3/m", "acct4/m"], "strategy": "round-robin"},
            "outer": {"candidates": ["pool/inner", "acct1/m"], "strategy": "round-robin",
                      "sticky": "on"},
        }
    )  # fmt: skip
    first = led.reserve("s1", "pool/outer", input_bytes=10)
    assert first.model == "acct3/m"
    ok(led, first.id)
    again = [led.reserve("s1", "pool/outer", input_bytes=10) for _ in range(3)]
    assert [r.model for r in again] == ["acct3/m"] * 3
    assert led.reserve("s2", "pool/outer", input_bytes=10).model == "acct1/m"  # s2 rotates on
    fail(led, again[0].id)
    assert led.reserve("s1", "pool/outer", input_bytes=10).model != "acct3/m"


def test_r_rt_6_a_refused_sticky_pick_inside_a_nested_pool_releases_the_lease(
    routing_ledger: RoutingFactory,
) -> None:
    led = routing_ledger(
        pools={
            "inner": {"candidates": ["acct3/m", "acct4/m"], "strategy": "primary"},
            "outer": {"candidates": ["pool/inner", "acct1/m"], "strategy": "primary",
                      "sticky": "on"},
        }
    )  # fmt: skip
    first = led.reserve("s1", "pool/outer", input_bytes=10)
    ok(led, first.id)
    assert first.model == "acct3/m"
    led.store.set_cooldown(CooldownScope.MODEL, "acct3/m", 5 * MIN, None)
    assert led.reserve("s1", "pool/outer", input_bytes=10).model == "acct4/m"
    assert not pool_state(led.db).leases  # released, not only passed over
