"""SPEC section 22, R-TOK-4: learned provider limits, stored by a settle and kept by a reserve.

A provider's answer says `x-ratelimit-remaining-tokens: 1200` and `x-ratelimit-reset-tokens: 20s`:
the settle keeps it per (provider, upstream model id) until its reset, and the next reserve on
that model whose token estimate does not fit what is left (the remaining minus the estimates
granted since the header was read) is refused `provider_tokens_exhausted` until the reset. Every
test runs on SQLite and PostgreSQL (BACKENDS). With `replyTokens` 100, 300 input bytes estimate
100 input + 100 reply tokens (R-TOK-2).
"""

from __future__ import annotations

from typing import Any

import pytest

from ledger.classify import classify_http
from ledger.errors import Refused
from ledger.kinds import CooldownScope, RefusalReason
from ledger.learned import read_limits
from ledger.records import Failed, Reservation, Success
from tests.support.backends import BACKENDS, db_url, rows, write
from tests.support.ledgers import T0, Clock, LedgerFactory

EACH = 200  # tokens one reservation of 300 bytes estimates (100 in + 100 reply)
BIG = 4500  # bytes estimating 1,500 input tokens: with the reply, 1,600 tokens


def _policy(**keys: Any) -> dict[str, Any]:
    return {"callsPerHour": 1000, "sourceCalls": 1000, "replyTokens": 100, **keys}


def _openai(remaining: str, reset: str = "20s") -> dict[str, str]:
    return {"x-ratelimit-remaining-tokens": remaining, "x-ratelimit-reset-tokens": reset,
            "x-ratelimit-limit-tokens": "30000"}  # fmt: skip


def _answered(led: Any, clock: Clock, headers: dict[str, str], model: str = "alpha/small") -> None:
    """One call on `model` whose answer carried `headers`, settled as the worker does."""
    granted = led.reserve("answered", model, input_bytes=300)
    limits = read_limits(headers, clock())
    led.settle(granted.id, Success(10, 5, limits=limits))


def _reserve(led: Any, n: int, size: int = 300, model: str = "alpha/small") -> Reservation:
    granted: Reservation = led.reserve(f"s{n}", model, input_bytes=size)
    return granted


def refused(fn: Any) -> Refused:
    with pytest.raises(Refused) as info:
        fn()
    return info.value


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_4_a_reported_remainder_refuses_what_does_not_fit_until_its_reset(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    led = make_ledger(**_policy())
    _answered(led, clock, _openai("1200"))
    clock.advance(1)
    error = refused(lambda: _reserve(led, 1, BIG))  # 1,600 tokens do not fit 1,200
    assert error.reason == RefusalReason.PROVIDER_TOKENS_EXHAUSTED
    assert error.detail == "tokens remaining 1200 of model alpha/small"
    assert error.retry_at_ms == T0 + 20_000  # the reset the provider said
    _reserve(led, 2, model="beta/mid")  # another model's limit is its own
    clock.advance(20_000 - 1)  # the reading ends at its reset
    assert _reserve(led, 3, BIG).estimate_tokens == 1600


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_4_grants_after_the_reading_are_subtracted_exactly(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    led = make_ledger(**_policy())
    later = led.reserve("later", "alpha/small", input_bytes=300)  # answers after the others
    _answered(led, clock, _openai(str(5 * EACH)))
    for n in range(5):  # 5 x 200 = the remainder: every one that fits is granted
        clock.advance(1)
        _reserve(led, n)
    clock.advance(1)
    error = refused(lambda: _reserve(led, 5))
    assert error.reason == RefusalReason.PROVIDER_TOKENS_EXHAUSTED
    assert error.detail == "tokens remaining 0 of model alpha/small"
    # a newer reading replaces it (the provider counted those calls): room again at once
    led.settle(later.id, Success(10, 5, limits=read_limits(_openai(str(3 * EACH)), clock())))
    clock.advance(1)
    _reserve(led, 6)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_4_input_and_output_kinds_and_a_failed_answer_are_learned(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None, home: Any
) -> None:
    led = make_ledger(**_policy())
    reset = "2027-01-15T08:00:30Z"  # T0 + 30 s, Anthropic's RFC 3339 form
    headers = {
        "anthropic-ratelimit-input-tokens-remaining": "5000",
        "anthropic-ratelimit-input-tokens-reset": reset,
        "anthropic-ratelimit-output-tokens-remaining": "150",
        "anthropic-ratelimit-output-tokens-reset": reset,
    }
    granted = led.reserve("answered", "beta/mid", input_bytes=300)
    failure = classify_http(429, {}, None, clock())
    led.settle(granted.id, Failed(failure, limits=read_limits(headers, clock())))
    led.store.clear_cooldown(CooldownScope.MODEL, "beta/mid", force=True)  # an operator's
    stored = rows(db_url(home, ledger_db),
                  "SELECT kind, remaining, reset_ms FROM learned_limits ORDER BY kind")
    assert stored == [("input_tokens", 5000, T0 + 30_000), ("output_tokens", 150, T0 + 30_000)]
    clock.advance(1)
    _reserve(led, 1, model="beta/mid")  # 100 output tokens fit 150
    clock.advance(1)
    error = refused(lambda: _reserve(led, 2, model="beta/mid"))  # 50 left: 100 do not
    assert error.detail == "output_tokens remaining 50 of model beta/mid"
    assert error.retry_at_ms == T0 + 30_000


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_4_an_older_reading_never_replaces_a_newer_one_and_retention_drops_dead_ones(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None, home: Any
) -> None:
    led = make_ledger(**_policy())
    url = db_url(home, ledger_db)
    old = led.reserve("old", "alpha/small", input_bytes=300)
    old_limits = read_limits(_openai("900000"), clock())
    clock.advance(5)
    _answered(led, clock, _openai("100"))
    led.settle(old.id, Success(10, 5, limits=old_limits))  # settled later, read earlier
    assert rows(url, "SELECT remaining FROM learned_limits") == [(100,)]
    clock.advance(25_000)  # past its reset: ignored, then deleted by retention
    _reserve(led, 1)
    _answered(led, clock, _openai("5000"), model="beta/mid")
    led.compact(100)
    assert rows(url, "SELECT provider, model_id, remaining FROM learned_limits") == [
        ("beta", "mid", 5000)
    ]


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_4_learn_limits_false_turns_it_off(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    led = make_ledger(**_policy(learnLimits=False))
    _answered(led, clock, _openai("0"))
    clock.advance(1)
    _reserve(led, 1, BIG)


def test_r_tok_4_an_override_skips_no_learned_limit(
    make_ledger: LedgerFactory, clock: Clock, home: Any
) -> None:
    led = make_ledger(**_policy())
    _answered(led, clock, _openai("10"))
    clock.advance(1)
    led.add_source("known")
    error = refused(lambda: led.evolve("known", "alpha/small", input_bytes=300))
    assert error.reason == RefusalReason.PROVIDER_TOKENS_EXHAUSTED
    write(db_url(home, None), "UPDATE learned_limits SET reset_ms = :at", at=clock() + 1)
    clock.advance(1)
    led.evolve("known", "alpha/small", input_bytes=300)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_4_selection_prefers_a_backup_with_room(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    led = make_ledger(**_policy(defaultModel="alpha/small",
                                tokenBudgets={"beta/mid": {"tokensPerMinute": 2 * EACH}}))
    _answered(led, clock, _openai("1200"))
    clock.advance(1)
    selection = led.select("s1", input_bytes=BIG)
    why = {e.model: (e.reason, e.until_ms) for e in selection.excluded}
    assert why["alpha/small"] == ("provider_tokens_exhausted", T0 + 20_000)
    assert selection.routes[0] != "alpha/small"
    assert "beta/mid" not in selection.routes  # 1,600 tokens never fit its 400 a minute
    assert why["beta/mid"] == ("token_budget", None)
    _reserve(led, 2, model="beta/mid")  # 200 fit: the window now holds 200 of 400
    clock.advance(1000)
    why = {e.model: (e.reason, e.until_ms) for e in led.select("s3", input_bytes=300).excluded}
    assert "alpha/small" not in why  # 200 tokens fit what alpha/small has left
    _reserve(led, 4, model="beta/mid")
    clock.advance(1000)
    why = {e.model: (e.reason, e.until_ms) for e in led.select("s5", input_bytes=300).excluded}
    assert why["beta/mid"] == ("token_budget", T0 + 1 + 60_000)  # the first grant leaves then
    off = make_ledger(**_policy(defaultModel="alpha/small", learnLimits=False))
    assert off.select("s6", input_bytes=BIG).routes[0] == "alpha/small"


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_4_of_answers_read_together_the_lower_remaining_is_kept(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None, home: Any
) -> None:
    """Answers read within CONCURRENT_MS of each other may have been decided by the provider in
    either order: an earlier-decided higher remaining that arrives a moment later must not
    replace the lower one (16 workers would spend the difference); a clearly newer one does."""
    from ledger.store.learned import CONCURRENT_MS

    led = make_ledger(**_policy())
    url = db_url(home, ledger_db)
    _answered(led, clock, _openai("2000"))
    clock.advance(3)  # decided before the first by the provider, read a moment after it
    _answered(led, clock, _openai("4000"))
    assert rows(url, "SELECT remaining FROM learned_limits") == [(2000,)]
    clock.advance(CONCURRENT_MS)  # a reading clearly newer: the window refilled
    _answered(led, clock, _openai("9000"))
    assert rows(url, "SELECT remaining FROM learned_limits") == [(9000,)]
