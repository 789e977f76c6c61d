"""R-TOK-4 and R-TOK-5 (simulate part): the simulated provider reports its own token limit in the
rate-limit headers of its wire format, so the ledger's learned limits act in a simulation as they
would live: a scenario where the provider's tokens per minute, not a call limit, is what bites,
drains with no 429 under learned limits and meets 429s with `"learnLimits": false`.

Each provider holds 11,000 tokens a minute (`targets.*.tokensPerMinute`); each call uses 1,000
input + 100 output tokens, and the ledger estimates it the same (3,000 bytes / 3 + `replyTokens`
100, R-TOK-2). `alpha` speaks OpenAI's format, `beta` Anthropic's (tests/support/simulation.py)."""

from __future__ import annotations

import json
import random
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ledger.catalog import Catalog
from ledger.kinds import FailureKind
from ledger.learned import LimitKind, read_limits
from ledger.simulate.provider import TokenReading, raw_response
from ledger.simulate.scenario import Scenario, ScenarioBehaviour
from ledger.simulate.simulation import simulate
from tests.support.simulation import CATALOG, _policy, _scenario

MINUTE = 60_000
PROVIDER_TPM = 11_000
LIMITED = {"alpha": {"tokensPerMinute": PROVIDER_TPM}, "beta": {"tokensPerMinute": PROVIDER_TPM}}
BASE: dict[str, Any] = {"callsPerHour": 1000, "replyTokens": 100, "crossProviderFallback": False}


def _behaviour() -> tuple[ScenarioBehaviour, int]:
    scenario = Scenario.model_validate({
        "start": "2027-01-15T00:00Z", "latency": {"fixedMs": 1000},
        "tokens": {"input": 1000, "output": 100}, "targets": {"p": {"tokensPerMinute": 11_000}},
    })
    return ScenarioBehaviour(scenario, random.Random(0)), scenario.start_ms()


def test_r_tok_4_every_answer_reports_what_is_left_of_the_providers_own_minute() -> None:
    behaviour, t0 = _behaviour()
    first, _ = behaviour.reply("p/m", "p", t0)
    # counted at the call, read as the answer arrives 1 s later: whole again when it leaves
    assert first.reading == TokenReading(PROVIDER_TPM - 1_100, t0 + MINUTE, PROVIDER_TPM)
    for i in range(1, 10):
        reply, _ = behaviour.reply("p/m", "p", t0 + i * 1000)
    assert reply.reading == TokenReading(0, t0 + 9_000 + MINUTE, PROVIDER_TPM)
    limited, _ = behaviour.reply("p/m", "p", t0 + 10_500)  # the 429 reports it too
    assert limited.kind is FailureKind.RATE_LIMIT
    assert limited.reading == TokenReading(0, t0 + 9_000 + MINUTE, PROVIDER_TPM)
    unlimited, _ = behaviour.reply("q/m", "q", t0 + 10_500)  # a target with no own limit
    assert unlimited.kind is None
    assert unlimited.reading is None


@pytest.mark.parametrize("anthropic", [False, True])
def test_r_tok_4_the_headers_are_the_providers_format_and_the_ledger_reads_them(
    anthropic: bool,
) -> None:
    behaviour, t0 = _behaviour()
    reply, _ = behaviour.reply("p/m", "p", t0)
    answered = t0 + reply.latency_ms
    for answer in (reply, behaviour.reply("p/m", "p", t0 + 30_000)[0]):
        response = raw_response(answer, answer.latency_ms, answered_ms=answered,
                                anthropic=anthropic)  # fmt: skip
        assert response is not None
        headers = dict(response.headers)
        if anthropic:
            assert set(headers) == {"anthropic-ratelimit-tokens-remaining",
                                    "anthropic-ratelimit-tokens-reset",
                                    "anthropic-ratelimit-tokens-limit"}  # fmt: skip
            reset = headers["anthropic-ratelimit-tokens-reset"]
            assert datetime.fromisoformat(reset.replace("Z", "+00:00")).timestamp() * 1000 == (
                t0 + MINUTE if answer is reply else t0 + 30_000 + MINUTE
            )
        else:
            assert set(headers) == {"x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
                                    "x-ratelimit-limit-tokens"}  # fmt: skip
        learned = read_limits(headers, answered)
        assert learned is not None
        (limit,) = learned.limits
        assert limit.kind is LimitKind.TOKENS
        assert limit.limit == PROVIDER_TPM
        assert (limit.remaining, limit.reset_at_ms) == (
            (9_900, t0 + MINUTE) if answer is reply else (8_800, t0 + 30_000 + MINUTE)
        )
    # an OpenAI reset is a duration from the answer: `59s` one second after the call
    openai = raw_response(reply, reply.latency_ms, answered_ms=answered)
    assert openai is not None
    assert openai.headers["x-ratelimit-reset-tokens"] == "59s"
    # none once the window is whole again
    late = raw_response(reply, reply.latency_ms, answered_ms=t0 + MINUTE)
    assert late is not None
    assert dict(late.headers) == {}


def _run(tmp_path: Path, model: str, seed: int = 0) -> dict[str, Any]:
    scenario = _scenario(tmp_path, hours=1, arrivals=[{"at": "00:00", "count": 60}],
                         targets=LIMITED)  # fmt: skip
    return simulate(
        scenario, _policy(**BASE, defaultModel=model), Catalog.model_validate(CATALOG),
        candidate=_policy(**BASE, defaultModel=model, learnLimits=False),
        drain_for_ms=3_600_000, seed=seed,
    ).document


@pytest.mark.parametrize("model", ["alpha/m", "beta/b"])  # OpenAI's headers, Anthropic's
def test_r_tok_5_simulate_learned_limits_turn_the_providers_429s_into_delayed_calls(
    tmp_path: Path, model: str
) -> None:
    doc = _run(tmp_path, model)
    learned, blind = doc["current"], doc["candidate"]
    # `"learnLimits": false`: the worker walks into the provider's 429s (and their cooldowns)
    assert blind["failedByKind"].get("rate_limit", 0) >= 2
    # learned limits: no 429; the model is left out (`provider_tokens_exhausted`, selection) or
    # refused at the reserve until the reading resets, and the calls wait
    assert learned["failedByKind"] == {}
    assert learned["longestCooldown"] is None
    waited = learned["items"].get("unroutable", 0) + learned["items"].get("refused", 0)
    assert waited > 0
    assert learned["items"].get("refused", 0) == learned["refusals"].get(
        "provider_tokens_exhausted", 0
    )
    assert (learned["done"], learned["calls"]) == (60, 60)  # delayed, none lost
    assert learned["timeToDrainMs"] >= 5 * MINUTE  # at most 10 calls a minute
    for run in (learned, blind):  # the call limit is not what bites in either run
        assert "shared_hourly_budget" not in run["refusals"]


def test_r_sim_3_learned_limits_keep_a_simulation_deterministic(tmp_path: Path) -> None:
    first = json.dumps(_run(tmp_path, "alpha/m", seed=3), sort_keys=True)
    assert json.dumps(_run(tmp_path, "alpha/m", seed=3), sort_keys=True) == first


def test_r_tok_4_a_provider_speaking_anthropics_format_answers_with_its_headers() -> None:
    from ledger.simulate.runner import anthropic_providers

    assert anthropic_providers(Catalog.model_validate(CATALOG)) == frozenset({"beta"})
