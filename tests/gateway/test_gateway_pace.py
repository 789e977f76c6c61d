"""R-GW-4: interactive pace in the policy table and the store (the decision the worker shares).

A transport failure, or a rate_limit with a short supplied wait, permits one same-model retry; a
second failure permits the table's fallback; the request's attempts bound everything; the other
rows act at once as the table says; nothing here changes what the queue's pace does.
"""

from __future__ import annotations

import json

import pytest

from ledger.attempt import plan_follow_up
from ledger.classify import Classification, classify_http, classify_kind
from ledger.config import parse_policy
from ledger.errors import ConfigError, Refused
from ledger.kinds import AttemptRole, FailureKind
from ledger.policy_table import FailureContext, InteractivePace, decide
from ledger.records import Failed, SettleResult, Success
from tests.support.ledgers import T0, Clock, LedgerFactory

PACE = InteractivePace(max_retry_wait_ms=3000, retry_backoff_ms=500, attempts_left=3)


def _ctx(c: Classification, pace: InteractivePace | None = PACE, **extra: object) -> FailureContext:
    fields: dict[str, object] = {
        "classification": c,
        "model_key": "alpha/small",
        "now_ms": T0,
        "recent_transport_strikes": 0,
        "failures": 0,
        "output_failures": 0,
        "backoff_steps": 0,
        "correction_used": False,
        "pace": pace,
        **extra,
    }
    return FailureContext(**fields)  # type: ignore[arg-type]


def test_r_gw_4_transport_is_retried_once_on_the_same_model_after_a_short_backoff() -> None:
    d = decide(_ctx(classify_http(503, {}, None, T0)), lambda: 1.0)
    assert d.retry_after_ms == 500  # at most retryBackoffMs
    assert d.fallback is None
    assert d.backoff_until_ms is None  # the request's own wait replaces the source backoff
    assert d.transport_strike  # strikes recorded as at the queue's pace
    queue = decide(_ctx(classify_http(503, {}, None, T0), pace=None), lambda: 1.0)
    assert queue.retry_after_ms is None
    assert queue.backoff_until_ms is not None


def test_r_gw_4_second_transport_failure_permits_the_tables_fallback() -> None:
    retried = InteractivePace(attempts_left=2, retried=True)
    d = decide(_ctx(classify_http(503, {}, None, T0), retried, recent_transport_strikes=1), _j)
    assert d.retry_after_ms is None
    assert d.fallback is not None
    assert d.cooldowns


def _j() -> float:
    return 0.0


@pytest.mark.parametrize(("retry_after", "retried"), [("2", True), ("10", False), (None, False)])
def test_r_gw_4_rate_limit_is_retried_only_with_a_short_supplied_wait(
    retry_after: str | None, retried: bool
) -> None:
    headers = {"retry-after": retry_after} if retry_after else {}
    d = decide(_ctx(classify_http(429, headers, None, T0)), _j)
    assert (d.retry_after_ms == 2000) is retried
    assert (d.fallback is None) is retried  # otherwise: the table's fallback at once
    assert d.cooldowns  # the model cools exactly as at the queue's pace


@pytest.mark.parametrize("status", [401, 400, 402])
def test_r_gw_4_other_rows_act_at_once(status: int) -> None:
    d = decide(_ctx(classify_http(status, {}, None, T0)), _j)
    assert d.retry_after_ms is None
    assert d.fallback is not None


def test_r_gw_4_safety_never_falls_back_and_attempts_bound_the_request() -> None:
    safety = decide(_ctx(classify_kind(FailureKind.SAFETY)), _j)
    assert safety.retry_after_ms is None
    assert safety.fallback is None
    spent = decide(_ctx(classify_http(503, {}, None, T0), InteractivePace(attempts_left=0)), _j)
    assert spent.retry_after_ms is None
    assert spent.fallback is None


def test_r_gw_4_a_follow_up_may_be_followed_at_interactive_pace() -> None:
    d = decide(_ctx(classify_http(401, {}, None, T0), was_follow_up=True), _j)
    assert d.fallback is not None
    queue = decide(_ctx(classify_http(401, {}, None, T0), pace=None, was_follow_up=True), _j)
    assert queue.fallback is None  # R-POL-4 unchanged


def test_r_gw_4_store_grants_the_retry_through_the_models_own_cooldown(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    first = led.reserve("gw-1", "alpha/small", input_bytes=100)
    limited = Failed(classify_http(429, {"retry-after": "1"}, None, clock()))
    step = led.settle_step(first.id, limited, pace=PACE)
    settled = led.write_steps([step])[0].value
    assert isinstance(settled, SettleResult)
    assert settled.retry_after_ms == 1000
    plan = plan_follow_up(settled, "alpha/small", frozenset(), lambda *a: [])
    assert plan is not None
    assert plan.role is AttemptRole.RETRY
    assert plan.wait_ms == 1000
    with pytest.raises(Refused):  # everyone else meets the cooldown
        led.reserve("other", "alpha/small", input_bytes=100)
    clock.advance(1000)
    retry = led.reserve("gw-1", "alpha/small", input_bytes=100, after=first.id)
    assert retry.role is AttemptRole.RETRY
    # the retry's failure (retried now) permits the table's fallback, a follow-up of a follow-up
    again = led.settle_step(retry.id, limited, pace=InteractivePace(attempts_left=2, retried=True))
    settled = led.write_steps([again])[0].value
    assert isinstance(settled, SettleResult)
    assert settled.retry_after_ms is None
    assert settled.fallback is not None
    fallback = led.reserve("gw-1", "beta/mid", input_bytes=100, after=retry.id)
    assert fallback.role is AttemptRole.FALLBACK
    led.settle(fallback.id, Success(1, 1))


def test_r_gw_4_queue_pace_failure_permits_no_retry(make_ledger: LedgerFactory) -> None:
    led = make_ledger()
    first = led.reserve("q-1", "alpha/small", input_bytes=100)
    settled = led.settle(first.id, Failed(classify_http(503, {}, None, T0)))
    assert settled.retry_after_ms is None
    with pytest.raises(Refused) as info:  # the backoff of the queue's pace holds
        led.reserve("q-1", "alpha/small", input_bytes=100, after=first.id)
    assert info.value.reason == "source_backoff"


@pytest.mark.parametrize(
    "gateway",
    [{"maxAttemptsPerRequest": 0}, {"firstTokenMs": -1}, {"idleMs": "fast"}, {"retries": 2}],
)
def test_r_gw_4_bad_gateway_keys_fail_closed_naming_the_field(gateway: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(json.dumps({"gateway": gateway}))
    message = str(info.value)
    assert "gateway" in message
    assert "fast" not in message  # never the value (R-CFG-3)


def test_r_gw_4_gateway_defaults() -> None:
    gw = parse_policy("{}").gateway
    assert (gw.max_retry_wait_ms, gw.retry_backoff_ms, gw.max_attempts_per_request) == (
        3000,
        500,
        4,
    )
    assert (gw.first_token_ms, gw.idle_ms) == (30000, 30000)
