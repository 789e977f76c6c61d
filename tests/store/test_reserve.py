"""SPEC section 7: every check of R-RES-1..11 in one write transaction, in the SPEC's order."""

from __future__ import annotations

import pytest
from freezegun import freeze_time

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.classify import classify_kind
from ledger.config import Policy
from ledger.errors import NotFoundError, Refused, UsageError
from ledger.kinds import AttemptRole, AttemptStatus, CooldownScope
from ledger.records import Cancelled, Failed, Success
from ledger.store import sqlite_driver
from tests.support.backends import BACKENDS, rows
from tests.support.ledgers import TEST_CATALOG, Clock, LedgerFactory

HOUR = 3_600_000
DAY = 24 * HOUR


def refusal(fn: object) -> str:
    with pytest.raises(Refused) as info:
        fn()  # type: ignore[operator]
    return info.value.reason


def test_r_res_1_shared_hourly_budget_across_sources_models_providers(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(callsPerHour=3)
    led.reserve("s1", "alpha/small")
    led.reserve("s2", "beta/mid")
    clock.advance(1000)
    led.reserve("s3", "alpha/big")
    assert refusal(lambda: led.reserve("s4", "beta/mid")) == "shared_hourly_budget"
    assert (
        refusal(lambda: led.reserve("s5", "alpha/small", override=True)) == "shared_hourly_budget"
    )


def test_r_res_1_rolling_hour_boundary_3599_vs_3601(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(callsPerHour=1)
    led.reserve("s1", "alpha/small")
    clock.advance(3_599_000)
    with pytest.raises(Refused) as info:
        led.reserve("s2", "alpha/small")
    assert info.value.reason == "shared_hourly_budget"
    assert info.value.retry_at_ms == clock.ms - 3_599_000 + HOUR
    clock.advance(2_000)
    assert led.reserve("s2", "alpha/small").id == 2


def test_r_res_1_every_outcome_counts(make_ledger: LedgerFactory) -> None:
    led = make_ledger(callsPerHour=3)
    a = led.reserve("s1", "alpha/small")
    b = led.reserve("s2", "alpha/small")
    c = led.reserve("s3", "alpha/small")
    led.settle(a.id, Success(10, 10))
    led.settle(b.id, Cancelled())
    led.settle(c.id, Failed(classify_kind("unknown")))
    assert refusal(lambda: led.reserve("s4", "beta/mid")) == "shared_hourly_budget"


def test_r_res_1_with_freezegun_wall_clock(home: object, tmp_path: object) -> None:
    with freeze_time("2027-01-01T00:00:00Z") as frozen:
        led = Ledger.open(
            home,  # type: ignore[arg-type]
            policy=Policy.model_validate({"callsPerHour": 1}),
            catalog=Catalog.model_validate(TEST_CATALOG),
            env={},
        )
        led.reserve("s1", "alpha/small")
        frozen.tick(3599)
        assert refusal(lambda: led.reserve("s2", "alpha/small")) == "shared_hourly_budget"
        frozen.tick(2)
        led.reserve("s2", "alpha/small")
        led.close()


def test_r_res_2_estimate_arithmetic(make_ledger: LedgerFactory) -> None:
    led = make_ledger(replyTokens=1000)
    # alpha/big: highest tiers 6 in / 22.5 out USD per MTok; reply reservation min(8192, 1000)
    res = led.reserve("s1", "alpha/big", input_bytes=2000)
    assert res.estimate_micro == 2000 * 6 + 1000 * 22.5
    # unknown price: no estimate (but allowed without a ceiling)
    assert led.reserve("s2", "beta/free/unknown").estimate_micro is None


def test_r_res_2_daily_ceiling_and_unknown_price(make_ledger: LedgerFactory, clock: Clock) -> None:
    # alpha/small: 1 in / 2 out per MTok, reply 4096 -> estimate = bytes + 8192 micro-USD
    led = make_ledger(dailyEstimatedUsd=0.05, callsPerHour=1000, sourceCalls=100)
    assert refusal(lambda: led.reserve("s0", "beta/free/unknown")) == "unknown_price"
    for i in range(5):
        led.reserve(f"s{i}", "alpha/small", input_bytes=1808)  # 10_000 micro each
    assert refusal(lambda: led.reserve("s5", "alpha/small", input_bytes=1808)) == (
        "daily_cost_ceiling"
    )  # 5 x 0.01 = 0.05 exactly, the sixth would exceed
    clock.advance(DAY - 1)
    assert (
        refusal(lambda: led.reserve("x", "alpha/small", input_bytes=1808)) == "daily_cost_ceiling"
    )
    clock.advance(2)
    led.reserve("x", "alpha/small", input_bytes=1808)


def test_r_res_2_actual_cost_replaces_estimate_failures_keep_it(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(dailyEstimatedUsd=0.0302, callsPerHour=1000)
    a = led.reserve("a", "alpha/small", input_bytes=1808)  # estimate 10_000
    b = led.reserve("b", "alpha/small", input_bytes=1808)
    c = led.reserve("c", "alpha/small", input_bytes=1808)
    assert (
        refusal(lambda: led.reserve("d", "alpha/small", input_bytes=1808)) == "daily_cost_ceiling"
    )
    led.settle(a.id, Success(input_tokens=100, output_tokens=50))  # actual 100*1 + 50*2 = 200
    r = led.reserve("d", "alpha/small", input_bytes=1808)
    led.settle(b.id, Cancelled())
    led.settle(c.id, Failed(classify_kind("transport")))
    led.settle(r.id, Success())  # missing usage: not assumed free
    assert (
        refusal(lambda: led.reserve("e", "alpha/small", input_bytes=1808)) == "daily_cost_ceiling"
    )


def test_r_res_3_settled_and_paused_sources(make_ledger: LedgerFactory) -> None:
    led = make_ledger(sourceCalls=2)
    res = led.reserve("s1", "alpha/small")
    led.settle(res.id, Success(finish=True))
    assert refusal(lambda: led.reserve("s1", "alpha/small")) == "source_settled"
    assert refusal(lambda: led.reserve("s1", "alpha/small", override=True)) == "source_settled"
    led.reserve("s2", "alpha/small")
    led.set_source_state("s2", "pause")
    assert refusal(lambda: led.reserve("s2", "alpha/small")) == "source_paused"
    assert refusal(lambda: led.reserve("s2", "alpha/small", override=True)) == "source_paused"
    led.set_source_state("s2", "resume")
    led.reserve("s2", "alpha/small")
    # resume keeps the counters: two calls used, the third is refused by the source cap
    assert refusal(lambda: led.reserve("s2", "alpha/small")) == "source_calls"


def test_r_res_4_source_backoff(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger()
    res = led.reserve("s1", "alpha/small")
    settled = led.settle(res.id, Failed(classify_kind("unknown")))  # generic backoff: 1 min
    assert "backoff" in " ".join(settled.actions)
    with pytest.raises(Refused) as info:
        led.reserve("s1", "alpha/small")
    assert info.value.reason == "source_backoff"
    assert info.value.retry_at_ms == clock.ms + 60_000
    led.reserve("s2", "alpha/small")  # another source is unaffected
    clock.advance(60_000)
    led.reserve("s1", "alpha/small")


def test_r_res_5_provider_and_model_cooldowns(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger()
    led.store.set_cooldown(CooldownScope.PROVIDER, "alpha", 60_000, None)
    assert refusal(lambda: led.reserve("s1", "alpha/small")) == "provider_cooldown"
    assert refusal(lambda: led.reserve("s1", "alpha/big")) == "provider_cooldown"
    led.store.set_cooldown(CooldownScope.MODEL, "beta/mid", 120_000, None)
    assert refusal(lambda: led.reserve("s1", "beta/mid")) == "model_cooldown"
    led.reserve("s1", "beta/free/unknown")  # model B is not blocked by model A's cooldown
    clock.advance(60_000)
    led.reserve("s2", "alpha/small")
    assert refusal(lambda: led.reserve("s3", "beta/mid")) == "model_cooldown"


def test_r_res_6_source_calls(make_ledger: LedgerFactory) -> None:
    led = make_ledger(sourceModels=5, sourceTimeMs=10_000_000)
    for _ in range(4):
        led.settle(led.reserve("s1", "alpha/small").id, Cancelled())
    assert refusal(lambda: led.reserve("s1", "alpha/small")) == "source_calls"
    led.reserve("s2", "alpha/small")


def test_r_res_7_source_models(make_ledger: LedgerFactory) -> None:
    led = make_ledger()
    led.settle(led.reserve("s1", "alpha/small").id, Cancelled())
    led.settle(led.reserve("s1", "beta/mid").id, Cancelled())
    assert refusal(lambda: led.reserve("s1", "alpha/big")) == "source_models"
    led.reserve("s1", "beta/mid")  # a model already used is not a new one


def test_r_res_8_source_time_counts_open_allowance_and_clamps_deadline(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(sourceCalls=10, sourceModels=5)  # timeout 120 s, source time 300 s
    first = led.reserve("s1", "alpha/small")
    assert first.deadline_ms == clock.ms + 120_000
    second = led.reserve("s1", "alpha/small")  # used: 120 s open allowance
    assert second.deadline_ms == clock.ms + 120_000
    third = led.reserve("s1", "alpha/small")  # used: 240 s -> 60 s left
    assert third.deadline_ms == clock.ms + 60_000
    assert refusal(lambda: led.reserve("s1", "alpha/small")) == "source_time"
    clock.advance(10_000)
    led.settle(first.id, Success())  # settled: 10 s instead of 120 s allowance -> 110 s left
    fourth = led.reserve("s1", "alpha/small")
    assert fourth.deadline_ms == clock.ms + 110_000


def test_r_res_9_override_skips_source_caps_not_ceilings_and_keeps_counters(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(callsPerHour=6, sourceCalls=1)
    led.reserve("s1", "alpha/small")
    led.store.set_cooldown(CooldownScope.PROVIDER, "beta", 600_000, None)
    assert refusal(lambda: led.reserve("s1", "alpha/small")) == "source_calls"
    res = led.evolve("s1", "beta/mid")  # skips cooldown, calls, models
    assert res.role == AttemptRole.OVERRIDE
    assert res.deadline_ms == clock.ms + 120_000
    assert refusal(lambda: led.reserve("s1", "alpha/small")) == "source_calls"  # not cleared
    for i in range(4):
        led.reserve(f"o{i}", "alpha/small")
    assert refusal(lambda: led.evolve("s1", "alpha/small")) == "shared_hourly_budget"


def test_r_res_10a_request_id_is_idempotent(make_ledger: LedgerFactory) -> None:
    led = make_ledger(callsPerHour=2)
    first = led.reserve("s1", "alpha/small", request_id="req-1")
    again = led.reserve("s1", "alpha/small", request_id="req-1")
    assert again.id == first.id
    assert again.replayed
    assert not first.replayed
    led.reserve("s2", "alpha/small")
    # replay works even when the budget is now full: it is the same slot, not a new one
    assert led.reserve("s1", "alpha/small", request_id="req-1").id == first.id
    with pytest.raises(UsageError):
        led.reserve("s2", "alpha/small", request_id="req-1")


def test_r_res_11_late_settle_records_usage_and_forbids_commit(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    res = led.reserve("s1", "alpha/small")
    clock.advance(120_001)
    result = led.settle(res.id, Success(input_tokens=10, output_tokens=5, finish=True))
    assert result.late
    assert result.must_not_commit
    assert not result.finished  # a late result never finishes its source
    assert result.cost_micro == 10 * 1 + 5 * 2


def test_r_res_11_abandoned_reservation_expires_and_keeps_counting(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(callsPerHour=2, dailyEstimatedUsd=1.0)
    res = led.reserve("s1", "alpha/small", input_bytes=1808)
    clock.advance(200_000)
    led.reserve("s2", "alpha/small")  # expiry happens lazily inside this transaction
    from ledger.store.views import source_detail

    detail = source_detail(led.db, "s1")
    assert detail is not None
    assert detail["attempts"][0]["status"] == AttemptStatus.EXPIRED.value
    assert detail["attempts"][0]["cost_micro"] == res.estimate_micro
    assert detail["budget"].time_used_ms == 120_000
    assert refusal(lambda: led.reserve("s3", "alpha/small")) == "shared_hourly_budget"
    late = led.settle(res.id, Cancelled())  # a crashed worker's settle still arrives late
    assert late.late


def test_settle_unknown_or_twice_is_bad_input(make_ledger: LedgerFactory) -> None:
    led = make_ledger()
    with pytest.raises(NotFoundError):
        led.settle(999, Success())
    res = led.reserve("s1", "alpha/small")
    led.settle(res.id, Success())
    with pytest.raises(UsageError):
        led.settle(res.id, Success())


@pytest.mark.parametrize("bad", ["", "x" * 201, "tab\there", "nl\n", "\x1b[31mred"])
def test_source_id_must_be_printable(make_ledger: LedgerFactory, bad: str) -> None:
    led = make_ledger()
    with pytest.raises(UsageError):
        led.reserve(bad, "alpha/small")


def test_unknown_model_is_bad_input(make_ledger: LedgerFactory) -> None:
    led = make_ledger()
    with pytest.raises(UsageError):
        led.reserve("s1", "alpha/nope")


def test_issue12_item13_a_refused_reserve_writes_no_source_and_expires_nothing(
    make_ledger: LedgerFactory, clock: Clock
) -> None:

    led = make_ledger(callsPerHour=1, timeoutMs=1000)
    led.reserve("s1", "alpha/small")
    clock.advance(5000)  # s1's reservation is past its deadline, still `open` in the table
    path = led.state.db_path
    assert path is not None
    with sqlite_driver.connect(path) as raw:
        before = raw.execute("SELECT id, status FROM reservations").fetchall()
    assert before == [(1, "open")]
    assert refusal(lambda: led.reserve("new-source", "beta/mid")) == "shared_hourly_budget"
    with sqlite_driver.connect(path) as raw:
        assert raw.execute("SELECT id FROM sources").fetchall() == [("s1",)]
        assert raw.execute("SELECT id, status FROM reservations").fetchall() == before
    clock.advance(HOUR)
    led.reserve("new-source", "beta/mid")  # a grant creates it (and expires the stale one)
    with sqlite_driver.connect(path) as raw:
        assert raw.execute("SELECT id FROM sources ORDER BY id").fetchall() == [
            ("new-source",),
            ("s1",),
        ]
        expired = raw.execute("SELECT status FROM reservations WHERE id = 1").fetchone()
    assert expired == ("expired",)


def test_issue12_item11_zero_price_is_not_free_under_a_ceiling(home: object, clock: Clock) -> None:
    raw = {
        "providers": {"paid": {"available": True}, "own": {"available": True}},
        "models": [
            {"provider": "paid", "id": "imported", "pricing": [
                {"inputUsdPerMTok": 0, "outputUsdPerMTok": 0}]},
            {"provider": "own", "id": "gpu", "billed": False},
        ],
    }  # fmt: skip
    led = Ledger.open(
        home,  # type: ignore[arg-type]
        policy=Policy.model_validate({"dailyEstimatedUsd": 0.000001, "sourceCalls": 10}),
        catalog=Catalog.model_validate(raw),
        env={},
        clock=clock,
    )
    for i in range(3):
        assert refusal(lambda i=i: led.reserve(f"s{i}", "paid/imported")) == "unknown_price"
    granted = [led.reserve(f"s{i}", "own/gpu") for i in range(3)]  # `"billed": false` is free
    assert [r.estimate_micro for r in granted] == [0, 0, 0]
    led.settle(granted[0].id, Success(input_tokens=10**6, output_tokens=10**6))
    led.reserve("s9", "own/gpu")  # its usage costs nothing either
    led.close()
    # without a ceiling the zero-priced paid model may run, but its cost counts as unknown
    free = Ledger.open(home, catalog=Catalog.model_validate(raw), env={}, clock=clock)  # type: ignore[arg-type]
    assert free.reserve("t1", "paid/imported").estimate_micro is None
    free.close()


def _spent_ceiling(led: Ledger, clock: Clock) -> None:
    """$0.001 actual at T0, then $0.049 estimated at T0 + 1 h: the $0.05 ceiling is full."""
    cheap = led.reserve("old", "alpha/small", input_bytes=0)  # estimate 8192 micro
    led.settle(cheap.id, Success(cost_usd=0.001))  # actual 1000 micro
    clock.advance(HOUR)
    led.reserve("big", "alpha/small", input_bytes=40_808)  # 49_000 micro, left open
    clock.advance(HOUR)


def test_issue12_item15_ceiling_refusal_says_when_enough_cost_leaves(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    from ledger.clock import iso

    t0 = clock.ms
    led = make_ledger(dailyEstimatedUsd=0.05, callsPerHour=100)
    _spent_ceiling(led, clock)
    with pytest.raises(Refused) as info:
        led.reserve("s1", "alpha/small", input_bytes=0)  # needs 8192: the cheap one is not enough
    assert info.value.reason == "daily_cost_ceiling"
    assert iso(info.value.retry_at_ms) == iso(t0 + HOUR + DAY)
    clock.ms = t0 + DAY  # the oldest (cheap) reservation left: still no room
    assert refusal(lambda: led.reserve("s1", "alpha/small")) == "daily_cost_ceiling"
    clock.ms = t0 + HOUR + DAY
    led.reserve("s1", "alpha/small")


def test_issue12_item15_selection_retry_at_waits_for_the_ceiling(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    t0 = clock.ms
    led = make_ledger(dailyEstimatedUsd=0.05, callsPerHour=100, defaultModel="alpha/small")
    _spent_ceiling(led, clock)
    selection = led.select("s1", input_bytes=0)
    assert selection.routes  # listed (selection grants nothing) ...
    assert selection.retry_at_ms == t0 + HOUR + DAY  # ... but none is reservable before then
    led.store.set_cooldown(CooldownScope.PROVIDER, "alpha", 2 * HOUR, None)
    led.store.set_cooldown(CooldownScope.PROVIDER, "beta", 3 * HOUR, None)
    cooling = led.select("s1", input_bytes=0)
    assert cooling.routes == ()
    assert cooling.retry_at_ms == t0 + HOUR + DAY  # not when the cooldowns end
    roomy = make_ledger(dailyEstimatedUsd=1, callsPerHour=100)
    assert roomy.select("s2").retry_at_ms == t0 + 4 * HOUR  # room: the cooldowns decide


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_res_9_evolve_is_for_a_known_source_a_mistyped_id_writes_nothing(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger()
    led.add_source("doc-1", "payload")
    with pytest.raises(NotFoundError, match="unknown source"):
        led.evolve("doc-l", "alpha/small")
    assert rows(led.state.db_url, "SELECT id FROM sources") == [("doc-1",)]
    assert rows(led.state.db_url, "SELECT count(*) FROM reservations") == [(0,)]
    assert led.evolve("doc-1", "alpha/small").role is AttemptRole.OVERRIDE
    # a plain reserve (and `override=True` in the API) still creates its source on first use
    assert led.reserve("new", "alpha/small", override=True).role is AttemptRole.OVERRIDE
