"""SPEC section 22, R-TOK-1..3: token-rate budgets checked in the reserving write transaction.

Every test runs on SQLite and PostgreSQL (BACKENDS). With `replyTokens` 100 and 300 input bytes
a reservation's estimate is 100 input + 100 reply tokens (R-TOK-2: ⌈bytes / 3⌉ + the allowance).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ledger.config import parse_policy
from ledger.errors import ConfigError, Refused
from ledger.kinds import RefusalReason
from ledger.records import Reservation, Success
from tests.support.backends import BACKENDS
from tests.support.ledgers import T0, Clock, LedgerFactory

MINUTE = 60_000
EACH = 200  # tokens one reservation of 300 bytes estimates (100 in + 100 reply)


def refused(fn: Any) -> Refused:
    with pytest.raises(Refused) as info:
        fn()
    return info.value


def _policy(**keys: Any) -> dict[str, Any]:
    return {"callsPerHour": 1000, "sourceCalls": 1000, "replyTokens": 100, **keys}


def _reserve(led: Any, n: int, model: str = "alpha/small", **kw: Any) -> Reservation:
    granted: Reservation = led.reserve(f"s{n}", model, input_bytes=300, **kw)
    return granted


def test_r_tok_1_policy_keys_parse_and_bad_limits_fail_closed_without_the_value() -> None:
    policy = parse_policy(json.dumps({
        "tokenBudgets": {"alpha": {"tokensPerMinute": 5}, "alpha/*": {"tokensPerDay": 9}},
        "scopes": {"night": {"inputTokensPerMinute": 3, "outputTokensPerMinute": 4}},
    }))
    assert policy.token_budgets["alpha"].tokens_per_minute == 5
    assert policy.scopes["night"].output_tokens_per_minute == 4
    secret = "sk-live-0123456789abcdef"
    for limits, said in (
        ({"tokensPerMinute": -1}, "must be greater than zero"),
        ({"tokensPerMinute": 0}, "must be greater than zero"),
        ({"tokensPerMinute": 1.5}, "must be an integer"),
        ({"tokensPerMinute": 1.0}, "must be an integer"),
        ({"tokensPerMinute": 10**13}, "is too large"),
        ({"tokensPerMinute": secret}, "must be an integer"),
        ({"tokensPerHour": 5}, "unknown key"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_policy(json.dumps({"tokenBudgets": {"alpha": limits}}))
        assert said in str(info.value)
        assert secret not in str(info.value)
    with pytest.raises(ConfigError, match="never a pool"):
        parse_policy(json.dumps({"tokenBudgets": {"pool/cheap": {"tokensPerMinute": 5}}}))


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_2_a_provider_window_grants_exactly_its_limit_and_says_when_it_frees(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    led = make_ledger(**_policy(tokenBudgets={"alpha": {"tokensPerMinute": 5 * EACH}}))
    first = _reserve(led, 0)
    assert (first.estimate_input_tokens, first.estimate_output_tokens) == (100, 100)
    assert first.to_json()["estimate_tokens"] == EACH
    for n in range(1, 5):
        clock.advance(1000)
        _reserve(led, n)  # 5 x 200 = the limit: every one that fits is granted
    error = refused(lambda: _reserve(led, 5))
    assert error.reason == RefusalReason.TOKEN_BUDGET
    assert error.detail == "tokensPerMinute 1000 of provider alpha"  # its target and limit
    assert error.retry_at_ms == T0 + MINUTE  # the first grant leaves the window then
    _reserve(led, 6, "beta/mid")  # another provider's window is its own
    # the window is (now - 60 s, now]: at 59.999 s the first grant still counts, at 60.000 s not
    clock.advance(T0 + MINUTE - 1 - clock())
    assert refused(lambda: _reserve(led, 7)).reason == RefusalReason.TOKEN_BUDGET
    clock.advance(1)
    _reserve(led, 8)
    assert refused(lambda: _reserve(led, 9)).retry_at_ms == T0 + 1000 + MINUTE


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_3_settling_with_small_usage_frees_the_difference_at_once(
    make_ledger: LedgerFactory, ledger_db: str | None
) -> None:
    led = make_ledger(**_policy(tokenBudgets={"alpha/small": {"tokensPerMinute": 2 * EACH}}))
    first = _reserve(led, 0)
    _reserve(led, 1)
    assert refused(lambda: _reserve(led, 2)).reason == RefusalReason.TOKEN_BUDGET
    led.settle(first.id, Success(input_tokens=10, output_tokens=10))  # frees 180 of 200
    small = led.reserve("s4", "alpha/small", input_bytes=3)  # 1 + 100 <= 400 - 220
    assert small.estimate_tokens == 101
    assert refused(lambda: _reserve(led, 5)).reason == RefusalReason.TOKEN_BUDGET


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_3_an_overrun_counts_in_full_and_again_at_its_settle_time(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    led = make_ledger(**_policy(tokenBudgets={"alpha": {"tokensPerMinute": 700}}))
    first = _reserve(led, 0)
    clock.advance(50_000)
    led.settle(first.id, Success(input_tokens=700, output_tokens=100))  # 800: 600 over
    # in the window: 800 at the grant time + 600 excess at the settle time
    assert refused(lambda: _reserve(led, 1)).retry_at_ms == T0 + MINUTE + 50_000
    clock.advance(20_000)  # the grant has left the window; its excess has not
    assert refused(lambda: _reserve(led, 2)).reason == RefusalReason.TOKEN_BUDGET
    clock.advance(T0 + MINUTE + 50_000 - clock())
    _reserve(led, 3)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_1_a_glob_is_one_window_over_every_model_it_matches(
    make_ledger: LedgerFactory, ledger_db: str | None
) -> None:
    led = make_ledger(**_policy(tokenBudgets={"alpha/*": {"inputTokensPerMinute": 250}}))
    _reserve(led, 0, "alpha/small")
    _reserve(led, 1, "alpha/big")  # 100 + 100 input tokens of the one shared window
    error = refused(lambda: _reserve(led, 2, "alpha/small"))
    assert error.reason == RefusalReason.TOKEN_BUDGET
    assert error.detail == "inputTokensPerMinute 250 of glob alpha/*"
    _reserve(led, 3, "beta/mid")  # not matched


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_1_a_scopes_token_window_and_an_override_skips_no_token_window(
    make_ledger: LedgerFactory, ledger_db: str | None
) -> None:
    led = make_ledger(**_policy(
        scopes={"night": {"outputTokensPerMinute": 250}},
        tokenBudgets={"beta/mid": {"tokensPerMinute": EACH}},
    ))
    _reserve(led, 0, scopes=["night"])
    _reserve(led, 1, scopes=["night"])  # the reply allowances: 200 of 250
    error = refused(lambda: _reserve(led, 2, scopes=["night"]))
    assert (error.reason, error.scope) == (RefusalReason.TOKEN_BUDGET, "night")
    _reserve(led, 3)  # outside the scope
    _reserve(led, 4, "beta/mid")
    over = refused(lambda: led.reserve("s5", "beta/mid", input_bytes=300, override=True))
    assert over.reason == RefusalReason.TOKEN_BUDGET
