"""R-TOK-5 (simulate part): `ledger simulate` applies the policy's token budgets to a workload, and
a scenario where a provider's own tokens-per-minute limit, not a call limit, is what bites.

The scenario's stand-in holds each provider to 11,000 tokens a minute (`targets.*.tokensPerMinute`,
the provider's OWN limit: a call over it is answered 429 with Retry-After). Each call uses 1,000
input + 100 output tokens, and the ledger estimates it the same (3,000 bytes / 3 + `replyTokens`
100, R-TOK-2), so 10 calls fit in a minute; `callsPerHour` 1,000 never bites on 60 sources. The
stand-in reports what is left of its limit on every answer (test_simulate_learned.py); here
the ledger does not learn from it (`learnLimits` false), so the budget alone is compared."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from ledger.catalog import Catalog
from ledger.errors import UsageError
from ledger.kinds import FailureKind
from ledger.simulate.inputs import load_workload
from ledger.simulate.scenario import Scenario, ScenarioBehaviour
from ledger.simulate.simulation import simulate
from tests.support.simulation import CATALOG, _policy, _scenario

MINUTE = 60_000
PROVIDER_TPM = 11_000
LIMITED = {"alpha": {"tokensPerMinute": PROVIDER_TPM}, "beta": {"tokensPerMinute": PROVIDER_TPM}}
BASE: dict[str, Any] = {"callsPerHour": 1000, "replyTokens": 100, "learnLimits": False}


def _run(tmp_path: Path, candidate_budgets: dict[str, Any]) -> dict[str, Any]:
    scenario = _scenario(tmp_path, hours=1, arrivals=[{"at": "00:00", "count": 60}],
                         targets=LIMITED)
    return simulate(
        scenario, _policy(**BASE), Catalog.model_validate(CATALOG),
        candidate=_policy(**BASE, tokenBudgets=candidate_budgets), drain_for_ms=3_600_000,
    ).document


def test_r_tok_5_simulate_a_token_budget_turns_the_providers_429s_into_delayed_calls(
    tmp_path: Path,
) -> None:
    doc = _run(tmp_path, {"alpha": {"tokensPerMinute": PROVIDER_TPM},
                          "beta": {"tokensPerMinute": PROVIDER_TPM}})
    without, with_budget = doc["current"], doc["candidate"]
    # without the budget: the worker walks into the providers' 429s (and their cooldowns)
    assert without["failedByKind"].get("rate_limit", 0) >= 2
    assert without["longestCooldown"]["kind"] == "rate_limit"
    # with it: no 429; the full model is excluded (`token_budget`, the selection) or refused at
    # the reserve until the minute frees, and the calls wait
    assert with_budget["failedByKind"] == {}
    assert with_budget["longestCooldown"] is None
    waited = with_budget["items"].get("unroutable", 0) + with_budget["items"].get("refused", 0)
    assert waited > 0
    assert with_budget["items"].get("refused", 0) == with_budget["refusals"].get("token_budget", 0)
    assert (with_budget["done"], with_budget["calls"]) == (60, 60)  # delayed, none lost
    assert with_budget["timeToDrainMs"] >= 2 * MINUTE  # 10 calls a minute on each provider
    # the call limit is not what bites in either run
    for run in (without, with_budget):
        assert "shared_hourly_budget" not in run["refusals"]


def test_r_tok_5_simulate_a_token_budget_above_the_providers_limit_still_meets_429s(
    tmp_path: Path,
) -> None:
    doc = _run(tmp_path, {"alpha": {"tokensPerMinute": 2 * PROVIDER_TPM},
                          "beta": {"tokensPerMinute": 2 * PROVIDER_TPM}})
    assert doc["candidate"]["failedByKind"].get("rate_limit", 0) > 0


def _behaviour(**profile: Any) -> tuple[ScenarioBehaviour, int]:
    scenario = Scenario.model_validate({
        "start": "2027-01-15T00:00Z", "latency": {"fixedMs": 1000},
        "tokens": {"input": 1000, "output": 100}, "targets": {"p": profile},
    })
    return ScenarioBehaviour(scenario, random.Random(0)), scenario.start_ms()


def test_r_sim_2_the_stand_in_holds_a_provider_to_its_own_tokens_per_minute() -> None:
    behaviour, t0 = _behaviour(tokensPerMinute=PROVIDER_TPM)
    for i in range(10):  # 10 x 1,100 tokens fit, on any model of the provider
        reply, _ = behaviour.reply(f"p/m{i % 2}", "p", t0 + i * 1000)
        assert reply.kind is None
    refused, _ = behaviour.reply("p/m0", "p", t0 + 10_500)
    assert (refused.kind, refused.status) == (FailureKind.RATE_LIMIT, 429)
    assert refused.retry_after_ms == 50_000  # the first call (at t0) leaves at t0 + 60 s
    assert behaviour.reply("q/other", "q", t0 + 10_500)[0].kind is None  # another provider
    # a refused call counts nothing; at t0 + 60 s the first call has left the minute
    assert behaviour.reply("p/m0", "p", t0 + MINUTE - 1)[0].kind is FailureKind.RATE_LIMIT
    assert behaviour.reply("p/m0", "p", t0 + MINUTE)[0].kind is None


def test_r_sim_4_a_providers_token_limit_must_be_a_positive_integer(tmp_path: Path) -> None:
    for bad in (0, -5, 1.5, 10**12):
        path = _scenario(tmp_path, targets={"alpha": {"tokensPerMinute": bad}})
        with pytest.raises(UsageError) as caught:
            load_workload(path, 0, "time")
        message = str(caught.value).removeprefix(str(path))
        assert message.startswith(": targets.<key>.tokensPerMinute: "), message
        assert str(bad) not in message
