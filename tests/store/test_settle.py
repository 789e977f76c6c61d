"""SPEC section 8 applied in the settle transaction: cooldowns, strikes, counters, pauses."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.api import Ledger
from ledger.classify import classify_http, classify_kind, classify_stop_reason
from ledger.errors import Refused, UsageError
from ledger.kinds import CooldownScope, FailureKind
from ledger.records import Cancelled, Failed, Success
from ledger.store.views import cooldown_list, source_detail
from tests.support.backends import BACKENDS
from tests.support.backends import rows as stored
from tests.support.ledgers import Clock, LedgerFactory

# The contract suite (R-DB-7): every case here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)

MIN = 60_000


def cooldowns(led: Ledger) -> dict[tuple[str, str], int]:
    _, rows = cooldown_list(led.db)
    out: dict[tuple[str, str], int] = {}
    for c in rows:
        out[(c.scope.value, c.target)] = max(out.get((c.scope.value, c.target), 0), c.until_ms)
    return out


def source(led: Ledger, sid: str) -> dict[str, object]:
    detail = source_detail(led.db, sid)
    assert detail is not None
    return dict(detail["source"])


def fail_http(led: Ledger, sid: str, model: str, status: int, now: int, **headers: str) -> object:
    res = led.reserve(sid, model)
    return led.settle(res.id, Failed(classify_http(status, headers, None, now)))


def test_r_pol_1_401_cools_provider_exactly_15_min_in_the_ledger(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    result = fail_http(led, "s1", "alpha/small", 401, clock.ms)
    assert result.kind == "auth"  # type: ignore[attr-defined]
    assert result.fallback == "other_provider"  # type: ignore[attr-defined]
    assert cooldowns(led) == {("provider", "alpha"): clock.ms + 15 * MIN}
    with pytest.raises(Refused) as info:
        led.reserve("s2", "alpha/big")  # shared by every source and process
    assert info.value.reason == "provider_cooldown"
    assert source(led, "s1")["retry_at_ms"] is None  # R-POL-6: no backoff of its own


@pytest.mark.parametrize(("retry_after", "seconds"), [("120", 120), ("5", 60), (None, 60)])
def test_r_pol_1_429_cools_the_model_max_60s_retry_after(
    make_ledger: LedgerFactory, clock: Clock, retry_after: str | None, seconds: int
) -> None:
    led = make_ledger()
    headers = {"retry-after": retry_after} if retry_after else {}
    fail_http(led, "s1", "alpha/small", 429, clock.ms, **headers)
    assert cooldowns(led) == {("model", "alpha/small"): clock.ms + seconds * 1000}
    led.reserve("s2", "alpha/big")  # model A's cooldown does not block model B


def test_r_pol_1_second_transport_failure_within_15_min_cools_model(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    first = fail_http(led, "s1", "alpha/small", 503, clock.ms)
    assert cooldowns(led) == {}
    assert first.fallback is None  # type: ignore[attr-defined]
    clock.advance(5 * MIN)
    second = fail_http(led, "s2", "alpha/small", 503, clock.ms)  # another source: strikes shared
    assert cooldowns(led) == {("model", "alpha/small"): clock.ms + 1 * MIN}
    assert second.fallback is not None  # type: ignore[attr-defined]


def test_r_pol_1_transport_strikes_outside_window_or_after_success_do_not_add_up(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(sourceCalls=10)
    fail_http(led, "s1", "alpha/small", 503, clock.ms)
    clock.advance(16 * MIN)
    fail_http(led, "s2", "alpha/small", 503, clock.ms)
    assert cooldowns(led) == {}
    led.settle(led.reserve("s3", "alpha/small").id, Success())  # a success resets strikes
    fail_http(led, "s4", "alpha/small", 503, clock.ms)
    assert cooldowns(led) == {}


def test_r_pol_2_cooldown_never_shortens(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger()
    fail_http(led, "s1", "alpha/small", 429, clock.ms, **{"retry-after": "600"})
    until = cooldowns(led)[("model", "alpha/small")]
    assert until == clock.ms + 600_000
    clock.advance(MIN)
    led.store.clear_cooldown(CooldownScope.MODEL, "alpha/small", force=False)  # manual only
    assert cooldowns(led)[("model", "alpha/small")] == until
    # a shorter hint on the same model (a later 429 with Retry-After 300) keeps the longer end
    led.add_source("s2", "payload")  # an override is for a known source
    res = led.evolve("s2", "alpha/small")
    led.settle(res.id, Failed(classify_http(429, {"retry-after": "300"}, None, clock.ms)))
    assert cooldowns(led)[("model", "alpha/small")] == until
    led.store.clear_cooldown(CooldownScope.MODEL, "alpha/small", force=True)
    assert cooldowns(led) == {}


def test_r_pol_3_backoff_steps_persist_per_source(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger(sourceCalls=10, sourceTimeMs=10_000_000)
    expected = [1, 5, 15, 60]
    for minutes in expected:
        res = led.reserve("s1", "alpha/small")
        led.settle(res.id, Failed(classify_kind("unknown")))
        assert source(led, "s1")["retry_at_ms"] == clock.ms + minutes * MIN  # jitter 0 here
        clock.advance(minutes * MIN)


def test_r_pol_5_three_output_failures_pause_with_persisted_correction(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(sourceCalls=10, sourceModels=5)
    truncated = classify_stop_reason("length")
    assert truncated is not None
    first = led.settle(led.reserve("s1", "alpha/small").id, Failed(truncated))
    assert first.use_correction
    assert source(led, "s1")["correction_used"]  # persisted: survives restarts
    second = led.settle(
        led.reserve("s1", "alpha/small").id, Failed(classify_kind("invalid_output", "json_schema"))
    )
    assert not second.use_correction
    assert second.fallback == "alternate_model"
    third = led.settle(led.reserve("s1", "beta/mid").id, Failed(classify_kind("invalid_output")))
    assert third.paused == "output_failures"
    with pytest.raises(Refused) as info:
        led.reserve("s1", "beta/mid")
    assert info.value.reason == "source_paused"


@pytest.mark.parametrize("kind", ["safety", "write_rejected"])
def test_r_pol_5_guard_failures_pause_and_never_fall_back(
    make_ledger: LedgerFactory, kind: str
) -> None:
    led = make_ledger()
    result = led.settle(
        led.reserve("s1", "alpha/small").id, Failed(classify_kind(kind, "pinned_replaces"))
    )
    assert result.paused is not None
    assert result.paused.startswith(kind)
    assert result.fallback is None
    assert source(led, "s1")["pause_reason"] == result.paused


def test_r_pol_5_five_mixed_failures_pause(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger(sourceCalls=10, sourceModels=5, sourceTimeMs=10_000_000)
    kinds = ["unknown", "stale", "unknown", "stale", "unknown"]
    for i, kind in enumerate(kinds):
        result = led.settle(led.reserve("s1", "alpha/small").id, Failed(classify_kind(kind)))
        clock.advance(2 * 3_600_000)
        assert (result.paused == "failure_cap") == (i == 4)


def test_cancelled_changes_no_counter_but_still_counts(make_ledger: LedgerFactory) -> None:
    led = make_ledger(callsPerHour=1)
    led.settle(led.reserve("s1", "alpha/small").id, Cancelled())
    row = source(led, "s1")
    assert (row["failures"], row["output_failures"], row["retry_at_ms"]) == (0, 0, None)
    with pytest.raises(Refused):
        led.reserve("s1", "alpha/small")


def test_r_gw_7_cancelled_records_the_usage_seen_and_moves_the_cost_only_when_complete(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger()
    partial = led.reserve("s1", "alpha/small")
    assert partial.estimate_micro is not None
    result = led.settle(partial.id, Cancelled(input_tokens=7, usage_estimated=True))
    assert result.cost_micro == partial.estimate_micro  # incomplete usage: the estimate
    complete = led.reserve("s2", "alpha/small")
    result = led.settle(complete.id, Cancelled(input_tokens=7, output_tokens=9))
    assert result.cost_micro == 7 * 1 + 9 * 2  # alpha/small: 1 and 2 USD/MTok, in micro-USD
    assert stored(
        led.db.url,
        "SELECT status, input_tokens, output_tokens, subkind, cost_micro FROM reservations"
        " ORDER BY id",
    ) == [
        ("cancelled", 7, None, "usage_estimated", partial.estimate_micro),
        ("cancelled", 7, 9, None, 25),
    ]
    # the hour's total follows the settled costs (R-RES-2)
    assert stored(led.db.url, "SELECT sum(cost_micro) FROM cost_hours") == [
        (partial.estimate_micro + 25,)
    ]
    with pytest.raises(UsageError):
        Cancelled(output_tokens=-1)


def test_r_pol_7_side_effects_forbid_fallback(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger()
    res = led.reserve("s1", "alpha/small")
    result = led.settle(res.id, Failed(classify_http(401, {}, None, clock.ms), side_effects=True))
    assert result.fallback is None


def test_r_diag_4_notices_deduplicated_across_restarts(
    make_ledger: LedgerFactory, clock: Clock, home: object
) -> None:
    led = make_ledger(sourceCalls=10, sourceTimeMs=10_000_000)
    for _ in range(2):
        led.settle(led.reserve("s1", "alpha/small").id, Failed(classify_kind("unknown")))
        clock.advance(2 * 3_600_000)
    again = make_ledger(sourceCalls=10, sourceTimeMs=10_000_000)  # a "restart"
    again.settle(again.reserve("s2", "beta/mid").id, Success())  # unrelated success
    again.settle(again.reserve("s1", "alpha/small").id, Failed(classify_kind("unknown")))
    rows = stored(again.db.url, "SELECT category, count FROM notices ORDER BY id")
    assert rows == [("failure", 3)]


def test_r_diag_4_one_fallback_notice_per_pair_per_hour(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    from ledger.kinds import AttemptRole

    led = make_ledger(callsPerHour=100)
    for sid in ("f0", "f1", "f2", "f9"):
        if sid == "f9":
            clock.advance(3_600_000)
        led.settle(led.reserve(sid, "alpha/small").id, Success())  # fallback_from must be used
        res = led.reserve(sid, "beta/mid", role=AttemptRole.FALLBACK, fallback_from="alpha/small")
        led.settle(res.id, Success())
    rows = stored(led.db.url, "SELECT category, count FROM notices ORDER BY id")
    assert rows == [("fallback", 3), ("fallback", 1)]


def test_r_diag_4_a_late_fallback_records_no_success_notice(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    """A fallback whose result came back after its deadline was not used (R-RES-11): no notice
    may say it succeeded."""
    from ledger.kinds import AttemptRole

    led = make_ledger(timeoutMs=1000)
    led.settle(led.reserve("s1", "alpha/small").id, Success())
    res = led.reserve("s1", "beta/mid", role=AttemptRole.FALLBACK, fallback_from="alpha/small")
    clock.advance(1001)
    settled = led.settle(res.id, Success())
    assert settled.late
    assert "fallback notice recorded" not in settled.actions
    assert stored(led.db.url, "SELECT count(*) FROM notices") == [(0,)]


OUTCOMES = st.sampled_from(
    [
        ("http", 401),
        ("http", 429),
        ("http", 503),
        ("http", 400),
        ("http", 402),
        ("kind", "invalid_output"),
        ("kind", "stale"),
        ("kind", "unknown"),
        ("kind", "cancelled"),
        ("ok", 0),
    ]
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(st.tuples(OUTCOMES, st.integers(0, 3 * 3_600_000)), max_size=12))
def test_r_pol_no_outcome_sequence_lets_a_source_exceed_its_caps(
    tmp_path_factory: pytest.TempPathFactory,
    ledger_db: str | None,
    steps: list[tuple[tuple[str, object], int]],
) -> None:
    from ledger.catalog import Catalog
    from tests.support.ledgers import TEST_CATALOG

    if ledger_db is not None:  # every example needs a fresh ledger: one SQLite file each
        pytest.skip("a per-example property; the scenarios above cover PostgreSQL")

    home = tmp_path_factory.mktemp("caps")
    clock = Clock()
    led = Ledger.open(
        home, catalog=Catalog.model_validate(TEST_CATALOG), env={}, clock=clock, jitter=lambda: 0.5
    )
    models = ["alpha/small", "beta/mid", "alpha/big"]
    granted: list[str] = []
    for i, ((what, value), gap) in enumerate(steps):
        try:
            res = led.reserve("s1", models[i % 3], override=False)
        except Refused:
            clock.advance(gap)
            continue
        granted.append(res.model)
        if what == "ok":
            led.settle(res.id, Success())
        elif what == "http":
            led.settle(res.id, Failed(classify_http(int(str(value)), {}, None, clock.ms)))
        elif value == "cancelled":
            led.settle(res.id, Cancelled())
        else:
            led.settle(res.id, Failed(classify_kind(FailureKind(str(value)))))
        clock.advance(gap)
    assert len(granted) <= 4  # sourceCalls
    assert len(set(granted)) <= 2  # sourceModels
    led.close()


def test_r_pol_4_transport_fallback_runs_despite_the_backoff_its_failure_set(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    from ledger.kinds import AttemptRole

    led = make_ledger()
    fail_http(led, "s0", "alpha/small", 503, clock.ms)  # first strike on the model
    res = led.reserve("s1", "alpha/small")
    second = led.settle(res.id, Failed(classify_http(503, {}, None, clock.ms)))
    assert second.fallback is not None  # the model is cooling now: fallback permitted
    with pytest.raises(Refused) as info:
        led.reserve("s1", "beta/mid")  # an ordinary reserve waits for the backoff
    assert info.value.reason == "source_backoff"
    backup = led.reserve(
        "s1", "beta/mid", role=AttemptRole.FALLBACK, fallback_from="alpha/small", after=res.id
    )
    assert backup.role == AttemptRole.FALLBACK
    led.settle(backup.id, Failed(classify_kind("unknown")))
    with pytest.raises(Refused) as again:  # only one follow-up: `after` is no longer the newest
        led.reserve("s1", "beta/mid", after=res.id)
    assert again.value.reason == "source_backoff"


@pytest.mark.parametrize("status", [503, 529])
def test_issue12_item7_a_5xx_retry_after_cools_the_model_from_the_first_failure(
    make_ledger: LedgerFactory, clock: Clock, status: int
) -> None:
    led = make_ledger()
    result = fail_http(led, "s1", "alpha/small", status, clock.ms, **{"retry-after": "120"})
    assert result.kind == "transport"  # type: ignore[attr-defined]
    assert cooldowns(led) == {("model", "alpha/small"): clock.ms + 120_000}
    assert result.fallback is not None  # type: ignore[attr-defined]  # the model is cooling
    with pytest.raises(Refused) as info:
        led.reserve("s2", "alpha/small")
    assert info.value.reason == "model_cooldown"


def test_issue12_item7_a_long_retry_after_outlives_the_strike_cooldown(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    fail_http(led, "s0", "alpha/small", 503, clock.ms)  # first strike, no hint: no cooldown
    assert cooldowns(led) == {}
    fail_http(led, "s1", "alpha/small", 503, clock.ms, **{"retry-after": "3600"})
    assert cooldowns(led) == {("model", "alpha/small"): clock.ms + 3_600_000}


def test_issue12_item7_retry_after_beyond_the_horizon_cools_for_the_horizon(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    fail_http(led, "s1", "alpha/small", 429, clock.ms, **{"retry-after": "99999999"})
    assert cooldowns(led) == {("model", "alpha/small"): clock.ms + 7 * 24 * 60 * MIN}


@pytest.mark.parametrize(
    "success",
    [
        lambda: Success(cost_usd=-1.0),
        lambda: Success(cost_usd=float("nan")),
        lambda: Success(cost_usd=float("inf")),
        lambda: Success(cost_usd=1e300),
        lambda: Success(input_tokens=-5, output_tokens=1),
        lambda: Success(input_tokens=1, output_tokens=10**13),
        lambda: Success(input_tokens=True, output_tokens=1),
        lambda: Success(cost_usd="1"),  # type: ignore[arg-type]
        lambda: Failed(classify_kind("unknown"), input_tokens=-1),
    ],
)
def test_issue12_item12_api_usage_is_validated_like_the_cli(
    make_ledger: LedgerFactory, success: object
) -> None:
    led = make_ledger()
    with pytest.raises(UsageError):
        success()  # type: ignore[operator]
    assert led.reserve("s1", "alpha/small").id == 1  # nothing was written, nothing raised raw


def test_issue12_item12_negative_cost_cannot_buy_ceiling_room(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(dailyEstimatedUsd=0.05, callsPerHour=100, sourceCalls=100)
    res = led.reserve("s1", "alpha/small", input_bytes=1000)
    with pytest.raises(UsageError):
        led.settle(res.id, Success(cost_usd=-1.0))
    led.settle(res.id, Success(cost_usd=0.05))  # the real cost fills the ceiling
    with pytest.raises(Refused) as info:
        led.reserve("s2", "alpha/small", input_bytes=1000)
    assert info.value.reason == "daily_cost_ceiling"


def test_issue12_item14_failure_notices_never_misstate_subkind_or_model(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(sourceCalls=10, sourceTimeMs=10_000_000, callsPerHour=100)
    for model, stop in [("alpha/small", "length"), ("beta/mid", None), ("alpha/small", "length")]:
        res = led.reserve("s1", model, override=True)
        cls = classify_stop_reason(stop) if stop else classify_kind("invalid_output", "json")
        assert cls is not None
        led.settle(res.id, Failed(cls))
    rows = stored(
        led.db.url, "SELECT message, count FROM notices WHERE category = 'failure' ORDER BY id"
    )
    assert rows == [
        ("invalid_output (length_stop) on alpha/small", 2),
        ("invalid_output (reported) on beta/mid", 1),
    ]
