"""Issue 20 item 4: prompt-cache tokens are counted at their own prices, never dropped.

Anthropic reports `cache_creation_input_tokens` / `cache_read_input_tokens` beside (not inside)
`input_tokens`; OpenAI's `prompt_tokens` includes `prompt_tokens_details.cached_tokens`. The ledger
records uncached input, cache writes and cache reads apart, prices each at the tier's price (a
missing or zero cache price falls back to the highest input price the model can bill), estimates
with the highest per-token input price, and shows cached tokens apart in `status`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import Message as AnthropicMessage
from click.testing import CliRunner
from openai.types.chat import ChatCompletion
from prometheus_client.parser import text_string_to_metric_families

from ledger.api import Ledger
from ledger.budgets import checks as budgets
from ledger.catalog import Catalog, Model, parse_catalog
from ledger.classify import classify_kind
from ledger.cli.main import cli
from ledger.errors import ConfigError, UsageError
from ledger.litellm import convert
from ledger.providers import CallRequest, Message, adapter_for
from ledger.providers.anthropic_messages import parse_message
from ledger.providers.bounded import JsonReply
from ledger.providers.openai_chat import parse_chat_completion
from ledger.records import Failed, Success
from ledger.standin.server import Scripted, StandIn
from ledger.store import queue as q
from ledger.store.compact import compact
from ledger.worker.handler import echo_handler
from ledger.worker.item import run_item
from ledger.worker.queue import HandlerResult
from tests.support.backends import BACKENDS
from tests.support.ledgers import Clock
from tests.support.queue_setup import db_rows, open_ledger, standin_home

SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "litellm-prices-sample.json"

CACHED_CATALOG: dict[str, Any] = {
    "providers": {
        "anth": {"available": True, "api": "anthropic-messages", "baseUrl": "http://127.0.0.1:9"},
        "oai": {"available": True, "api": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1"},
    },
    "models": [
        {
            "provider": "anth",
            "id": "sonnet",
            "maxOutputTokens": 1000,
            "pricing": [
                {"upToInputTokens": 200000, "inputUsdPerMTok": 3, "outputUsdPerMTok": 15,
                 "cacheWriteUsdPerMTok": 3.75, "cacheReadUsdPerMTok": 0.3},
                {"inputUsdPerMTok": 6, "outputUsdPerMTok": 22.5,
                 "cacheWriteUsdPerMTok": 7.5, "cacheReadUsdPerMTok": 0.6},
            ],
        },
        {
            "provider": "oai",
            "id": "mini",
            "maxOutputTokens": 1000,
            "pricing": [{"inputUsdPerMTok": 0.4, "outputUsdPerMTok": 1.6,
                         "cacheReadUsdPerMTok": 0.1}],
        },
        {
            "provider": "oai",
            "id": "nocache",
            "maxOutputTokens": 1000,
            "pricing": [
                {"upToInputTokens": 1000, "inputUsdPerMTok": 1, "outputUsdPerMTok": 2},
                {"inputUsdPerMTok": 4, "outputUsdPerMTok": 2, "cacheReadUsdPerMTok": 0},
            ],
        },
    ],
}  # fmt: skip


def _catalog() -> Catalog:
    return Catalog.model_validate(CACHED_CATALOG)


def _model(key: str) -> Model:
    return _catalog().require_model(key)


def _micro(*terms: tuple[int, str]) -> int:
    """Tokens x USD/MTok = micro-USD, rounded up like the ledger does."""
    return math.ceil(sum(Decimal(n) * Decimal(p) for n, p in terms))


# ------------------------------------------------------------------------------ catalog


def test_issue20_item4_catalog_tiers_take_cache_prices() -> None:
    tier = _model("anth/sonnet").pricing or []
    assert tier[0].cache_write_usd_per_mtok == 3.75
    assert tier[0].cache_read_usd_per_mtok == 0.3
    dumped = _catalog().to_json()["models"][0]["pricing"][1]
    assert dumped["cacheWriteUsdPerMTok"] == 7.5
    assert dumped["cacheReadUsdPerMTok"] == 0.6


@pytest.mark.parametrize("field", ["cacheWriteUsdPerMTok", "cacheReadUsdPerMTok"])
@pytest.mark.parametrize("bad", [-1, "1", 2_000_000, True])
def test_issue20_item4_bad_cache_price_is_a_config_error(field: str, bad: object) -> None:
    document = json.loads(json.dumps(CACHED_CATALOG))
    document["models"][1]["pricing"][0][field] = bad
    with pytest.raises(ConfigError):
        parse_catalog(json.dumps(document))


def test_issue20_item4_catalog_show_prints_cache_prices(tmp_path: Path) -> None:
    home = _home(tmp_path)
    shown = CliRunner().invoke(cli, ["--home", str(home), "catalog", "show"])
    assert shown.exit_code == 0, shown.output
    assert "reasoning=no  cache=3.75/0.3 <=200000; 7.5/0.6\n" in shown.output
    assert "reasoning=no  cache=?/0.1\n" in shown.output
    assert "oai/nocache" in shown.output


def test_issue20_item4_example_catalog_documents_cache_prices() -> None:
    from ledger.catalog import example_catalog

    priced = [
        t
        for m in example_catalog().models
        for t in m.pricing or []
        if t.cache_write_usd_per_mtok is not None or t.cache_read_usd_per_mtok is not None
    ]
    assert priced


# ------------------------------------------------------------------------------ pricing


def test_issue20_item4_cached_tokens_priced_at_their_tier_prices() -> None:
    # 1,000 uncached + 20,000 written + 100,000 read = 121,000 prompt tokens: the first tier
    cost = budgets.actual_micro(_model("anth/sonnet"), 1000, 500, 20_000, 100_000)
    assert cost == _micro((1000, "3"), (500, "15"), (20_000, "3.75"), (100_000, "0.3"))
    # cached tokens are never dropped: the old reading (input + output only) was far lower
    plain = budgets.actual_micro(_model("anth/sonnet"), 1000, 500)
    assert cost is not None
    assert plain is not None
    assert cost > plain


def test_issue20_item4_tier_chosen_by_the_whole_prompt_cached_included() -> None:
    # 1,000 uncached tokens alone fit the first tier; with 250,000 read from the cache the prompt
    # is above 200k and every part is billed at the second tier
    cost = budgets.actual_micro(_model("anth/sonnet"), 1000, 100, 0, 250_000)
    assert cost == _micro((1000, "6"), (100, "22.5"), (250_000, "0.6"))


def test_issue20_item4_missing_or_zero_cache_price_falls_back_to_highest_input_price() -> None:
    # mini has no cache-write price: writes cost the highest input price (0.4), never zero
    mini = budgets.actual_micro(_model("oai/mini"), 100, 10, 5000, 2000)
    assert mini == _micro((100, "0.4"), (10, "1.6"), (5000, "0.4"), (2000, "0.1"))
    # nocache: no cache price in the first tier, an explicit 0 in the second: both fall back to
    # the highest input price over all tiers (4)
    low = budgets.actual_micro(_model("oai/nocache"), 100, 10, 0, 500)
    assert low == _micro((100, "1"), (10, "2"), (500, "4"))
    high = budgets.actual_micro(_model("oai/nocache"), 100, 10, 0, 5000)
    assert high == _micro((100, "4"), (10, "2"), (5000, "4"))


def test_issue20_item4_estimate_uses_the_highest_input_price_cache_writes_included() -> None:
    # the highest per-token input price sonnet can bill is the second tier's cache write (7.5)
    assert _model("anth/sonnet").max_input_price() == Decimal("7.5")
    estimate = budgets.estimate_micro(_model("anth/sonnet"), 10_000, 4096)
    assert estimate == _micro((10_000, "7.5"), (1000, "22.5"))
    assert budgets.estimate_micro(_model("oai/mini"), 10_000, 4096) == _micro(
        (10_000, "0.4"), (1000, "1.6")
    )


def test_issue20_item4_cached_usage_is_validated_like_other_usage() -> None:
    with pytest.raises(UsageError):
        Success(10, 10, cache_read_tokens=-1)
    with pytest.raises(UsageError):
        Failed(classify_kind("transport"), cache_write_tokens=10**13)


# ------------------------------------------------------------------------------ LiteLLM import

_LITELLM_ENTRY: dict[str, Any] = {
    "litellm_provider": "anthropic",
    "mode": "chat",
    "input_cost_per_token": 3e-06,
    "output_cost_per_token": 1.5e-05,
    "input_cost_per_token_above_200k_tokens": 6e-06,
    "output_cost_per_token_above_200k_tokens": 2.25e-05,
    "cache_creation_input_token_cost": 3.75e-06,
    "cache_creation_input_token_cost_above_1hr": 6e-06,
    "cache_creation_input_token_cost_above_200k_tokens": 7.5e-06,
    "cache_creation_input_token_cost_above_1hr_above_200k_tokens": 1.2e-05,
    "cache_read_input_token_cost": 3e-07,
    "cache_read_input_token_cost_above_200k_tokens": 6e-07,
    "cache_read_input_token_cost_priority": 9e-07,
    "cache_read_input_token_cost_flex": 1e-09,
}


def test_issue20_item4_litellm_cache_prices_imported_per_tier() -> None:
    model = convert({"claude-x": _LITELLM_ENTRY}).catalog.require_model("anthropic/claude-x")
    tiers = [
        (t.up_to_input_tokens, t.input_usd_per_mtok, t.cache_write_usd_per_mtok,
         t.cache_read_usd_per_mtok)
        for t in model.pricing or []
    ]  # fmt: skip
    # a cache write is priced at the dearer of the 5-minute and 1-hour writes (the reply may not
    # say which one was written); priority and flex prices are not imported
    assert tiers == [(200_000, 3.0, 6.0, 0.3), (None, 6.0, 12.0, 0.6)]


def test_issue20_item4_litellm_cache_hit_price_is_a_cache_read_price() -> None:
    entry = {"litellm_provider": "deepseek", "mode": "chat", "input_cost_per_token": 2e-07,
             "output_cost_per_token": 4e-07, "input_cost_per_token_cache_hit": 2e-08}  # fmt: skip
    model = convert({"d": entry}).catalog.require_model("deepseek/d")
    assert (model.pricing or [])[0].cache_read_usd_per_mtok == 0.02


@pytest.mark.parametrize("bad", [-1e-06, "cheap", float("inf"), True])
def test_issue20_item4_litellm_bad_cache_price_skips_the_entry(bad: object) -> None:
    result = convert({"claude-x": {**_LITELLM_ENTRY, "cache_read_input_token_cost": bad}})
    assert result.imported == 0
    assert result.skipped_by_reason == {"bad_entry": 1}


@pytest.fixture(scope="module")
def sample() -> dict[str, Any]:
    if not SAMPLE.is_file():
        pytest.skip(f"real LiteLLM sample not found at {SAMPLE} (shared data not checked out)")
    data: dict[str, Any] = json.loads(SAMPLE.read_text())
    return data


@pytest.mark.parametrize(
    ("key", "tiers"),
    [
        ("anthropic/claude-sonnet-4-5", [(200_000, 3.0, 6.0, 0.3), (None, 6.0, 12.0, 0.6)]),
        ("openai/gpt-4.1", [(None, 2.0, None, 0.5)]),
        ("openai/gpt-4o", [(None, 2.5, None, 1.25)]),
    ],
)
def test_issue20_item4_real_sample_cache_prices(
    sample: dict[str, Any], key: str, tiers: list[tuple[Any, ...]]
) -> None:
    model = convert(sample).catalog.require_model(key)
    found = [
        (t.up_to_input_tokens, t.input_usd_per_mtok, t.cache_write_usd_per_mtok,
         t.cache_read_usd_per_mtok)
        for t in model.pricing or []
    ]  # fmt: skip
    assert found == tiers


def test_issue20_item4_real_sample_every_cache_price_is_imported(sample: dict[str, Any]) -> None:
    catalog = convert(sample).catalog
    cached = [
        k
        for k, v in sample.items()
        if isinstance(v, dict) and v.get("mode") == "chat"
        and isinstance(v.get("cache_read_input_token_cost"), float)
        and v["cache_read_input_token_cost"] > 0
    ]  # fmt: skip
    assert len(cached) > 50
    for key in cached:
        model = catalog.model(f"{sample[key]['litellm_provider']}/{key}")
        if model is None:  # kept under another entry of the same key, or skipped as bad
            continue
        base = (model.pricing or [])[0]
        per_mtok = Decimal(repr(sample[key]["cache_read_input_token_cost"])) * 1_000_000
        assert Decimal(repr(base.cache_read_usd_per_mtok)) == per_mtok.quantize(Decimal("1e-6"))


# ------------------------------------------------------------------------------ adapters


def _reply(data: object) -> JsonReply:
    return JsonReply(status=200, data=data, started=time.monotonic())


def test_issue20_item4_anthropic_usage_reads_cache_creation_and_read() -> None:
    usage = {"input_tokens": 12, "output_tokens": 30, "cache_creation_input_tokens": 2048,
             "cache_read_input_tokens": 9000,
             "cache_creation": {"ephemeral_5m_input_tokens": 2048, "ephemeral_1h_input_tokens": 0}}
    body = {"content": [{"type": "text", "text": "x"}], "stop_reason": "end_turn", "usage": usage}
    response = parse_message(_reply(body))  # fmt: skip
    assert (response.input_tokens, response.cache_write_tokens, response.cache_read_tokens) == (
        12, 2048, 9000)  # fmt: skip
    assert response.output_tokens == 30


def test_issue20_item4_openai_prompt_tokens_include_cached_ones() -> None:
    usage = {"prompt_tokens": 5000, "completion_tokens": 7, "total_tokens": 5007,
             "prompt_tokens_details": {"cached_tokens": 4608, "audio_tokens": 0}}
    body = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}], "usage": usage}
    response = parse_chat_completion(_reply(body))  # fmt: skip
    assert (response.input_tokens, response.cache_write_tokens, response.cache_read_tokens) == (
        392, None, 4608)  # fmt: skip


@pytest.mark.parametrize(
    ("details", "expected"),
    [
        (None, (100, None, None)),
        ({"cached_tokens": None}, (100, None, None)),
        ({"cached_tokens": 0}, (100, None, 0)),
        ({"cached_tokens": 40, "cache_write_tokens": 50}, (10, 50, 40)),
        # more cached than prompt tokens: never a negative count; the excess is over-counted
        ({"cached_tokens": 150}, (0, None, 150)),
        ({"cached_tokens": -5}, (100, None, None)),
    ],
)
def test_issue20_item4_openai_cached_details_shapes(
    details: object, expected: tuple[int | None, ...]
) -> None:
    usage: dict[str, Any] = {"prompt_tokens": 100, "completion_tokens": 1}
    if details is not None:
        usage["prompt_tokens_details"] = details
    body = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}], "usage": usage}
    response = parse_chat_completion(_reply(body))
    found = (response.input_tokens, response.cache_write_tokens, response.cache_read_tokens)
    assert found == expected


def test_issue20_item4_handler_results_carry_cached_usage() -> None:
    body = {"content": [], "stop_reason": "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 2, "cache_creation_input_tokens": 3,
                      "cache_read_input_tokens": 4}}  # fmt: skip
    response = parse_message(_reply(body))
    for result in (HandlerResult.success(response), HandlerResult.failed_call(response)):
        assert (result.cache_write_tokens, result.cache_read_tokens) == (3, 4)


# ------------------------------------------------------------------------------ official SDKs


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


def _ours(standin: StandIn, api: str) -> Any:
    base = standin.base_url_openai if api == "openai" else standin.base_url_anthropic
    provider = _catalog().providers["oai" if api == "openai" else "anth"]
    provider = provider.model_copy(update={"base_url": base, "available": None,
                                           "credential_env": "K"})  # fmt: skip
    deadline = int(time.time() * 1000) + 5000
    request = CallRequest("m", (Message("user", "hi"),), 64, deadline)
    return adapter_for(provider, {"K": "sk-test"}).call(
        request, now_ms=lambda: int(time.time() * 1000)
    )


def test_issue20_item4_anthropic_sdk_usage_shape_over_http(standin: StandIn) -> None:
    reply = Scripted(input_tokens=12, output_tokens=30, cache_write_tokens=2048,
                     cache_read_tokens=9000)  # fmt: skip
    standin.set_script("m", [reply, reply])
    client = anthropic.Anthropic(api_key="sk-test", base_url=standin.base_url_anthropic,
                                 max_retries=0, timeout=5.0)  # fmt: skip
    raw = client.messages.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=64
    )
    usage = AnthropicMessage.model_validate(raw.http_response.json()).usage
    # the SDK's own reading: input_tokens leaves out the cache writes and reads
    assert (usage.input_tokens, usage.cache_creation_input_tokens, usage.cache_read_input_tokens) \
        == (12, 2048, 9000)  # fmt: skip
    response = _ours(standin, "anthropic")
    found = (response.input_tokens, response.cache_write_tokens, response.cache_read_tokens)
    assert found == (
        usage.input_tokens, usage.cache_creation_input_tokens, usage.cache_read_input_tokens
    )


def test_issue20_item4_openai_sdk_usage_shape_over_http(standin: StandIn) -> None:
    reply = Scripted(input_tokens=392, output_tokens=7, cache_read_tokens=4608)
    standin.set_script("m", [reply, reply])
    client = openai.OpenAI(api_key="sk-test", base_url=standin.base_url_openai, max_retries=0,
                           timeout=5.0)  # fmt: skip
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=64
    )
    usage = ChatCompletion.model_validate(raw.http_response.json()).usage
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    # the SDK's own reading: prompt_tokens includes the cached tokens
    assert (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens) == (5000, 4608)
    response = _ours(standin, "openai")
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    assert (response.input_tokens, response.cache_read_tokens) == (
        usage.prompt_tokens - cached, cached)  # fmt: skip


@pytest.mark.parametrize(("default", "model"), [("p1/m1", "m1"), ("p2/m2", "m2")])
@pytest.mark.parametrize("text", ['{"ok": true}', "not json"])
def test_issue20_item4_worker_records_cached_usage_over_http(
    tmp_path: Path, standin: StandIn, default: str, model: str, text: str
) -> None:
    """The worker's echo handler over real HTTP, both wire formats, success and invalid output:
    the attempt stores the cached tokens apart and pays for them (no cache price in this
    catalog: the highest input price)."""
    led = open_ledger(standin_home(tmp_path / "h", standin, defaultModel=default))
    try:
        standin.set_script(model, [Scripted(text=text, input_tokens=100, output_tokens=10,
                                            cache_write_tokens=1000, cache_read_tokens=5000)])
        led.add_source("s", "payload")
        claim = q.claim(led.db, "w", led.policy.lease_ms)
        assert claim is not None
        run_item(led, claim, echo_handler)
        price = _catalog_price(led, default)
    finally:
        led.close()
    query = ("SELECT input_tokens, output_tokens, cache_write_tokens, cache_read_tokens,"
             " actual_micro, status FROM reservations ORDER BY id")  # fmt: skip
    rows = db_rows(led.state.path, query)
    status = "succeeded" if text.startswith("{") else "failed"
    expected = _micro((100 + 1000 + 5000, price), (10, str(2 * Decimal(price))))
    assert rows[0] == (100, 10, 1000, 5000, expected, status)  # (a correction may follow)


def _catalog_price(led: Ledger, key: str) -> str:
    return str((led.catalog.require_model(key).pricing or [])[0].input_usd_per_mtok)


# ------------------------------------------------------------------------------ the ledger


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(CACHED_CATALOG))
    (home / "recovery.json").write_text(json.dumps({"defaultModel": "anth/sonnet"}))
    return home


def _open(home: Path, clock: Clock) -> Ledger:
    return Ledger.open(home, catalog=_catalog(), env={}, clock=clock, jitter=lambda: 0.0)


def _status(home: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--home", str(home), "status", *args])
    assert result.exit_code == 0, result.output
    return str(result.output)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_issue20_item4_settle_records_cached_tokens_and_their_cost(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home, clock = _home(tmp_path), Clock()
    led = _open(home, clock)
    try:
        ok = led.reserve("s1", "anth/sonnet", input_bytes=1000)
        settled = led.settle(ok.id, Success(1000, 500, cache_write_tokens=20_000,
                                            cache_read_tokens=100_000))  # fmt: skip
        expected = _micro((1000, "3"), (500, "15"), (20_000, "3.75"), (100_000, "0.3"))
        assert settled.cost_micro == expected
        bad = led.reserve("s2", "anth/sonnet", input_bytes=1000)
        failed = led.settle(bad.id, Failed(classify_kind("invalid_output"), input_tokens=10,
                                           output_tokens=5, cache_write_tokens=7,
                                           cache_read_tokens=9))  # fmt: skip
        assert failed.cost_micro == _micro((10, "3"), (5, "15"), (7, "3.75"), (9, "0.3"))
        detail = CliRunner().invoke(cli, ["--home", str(home), "source", "show", "s1", "--json"])
        attempt = json.loads(detail.output)["attempts"][0]
        assert (attempt["input_tokens"], attempt["cache_write_tokens"],
                attempt["cache_read_tokens"]) == (1000, 20_000, 100_000)  # fmt: skip
    finally:
        led.close()
    doc = json.loads(_status(home, "--json"))
    daily = doc["daily"]
    assert (daily["input_tokens"], daily["cache_write_tokens"], daily["cache_read_tokens"]) == (
        1010, 20_007, 100_009)  # fmt: skip
    assert daily["spent_usd"] == pytest.approx((expected + failed.cost_micro) / 1e6)
    text = _status(home)
    assert "cache write 20,007" in text
    assert "cache read 100,009" in text
    families = {
        f.name: f for f in text_string_to_metric_families(_status(home, "--prometheus"))
    }
    samples = {s.labels["direction"]: s.value for s in families["ledger_daily_tokens"].samples}
    assert samples == {"input": 1010, "output": 505, "cache_write": 20_007, "cache_read": 100_009}


def test_issue20_item4_cli_settle_takes_cached_tokens(tmp_path: Path) -> None:
    home = _home(tmp_path)
    run = CliRunner().invoke
    reserved = run(cli, ["--home", str(home), "reserve", "s", "--model", "oai/mini", "--json"])
    rid = str(json.loads(reserved.output)["id"])
    args = ["--home", str(home), "settle", rid, "--ok", "--input-tokens", "100",
            "--output-tokens", "10", "--cache-write-tokens", "5000", "--cache-read-tokens", "2000",
            "--json"]  # fmt: skip
    result = run(cli, args)
    assert result.exit_code == 0, result.output
    cost = json.loads(result.output)["cost_usd"]
    assert cost == _micro((100, "0.4"), (10, "1.6"), (5000, "0.4"), (2000, "0.1")) / 1e6
    refused = run(cli, ["--home", str(home), "settle", rid, "--kind", "transport",
                        "--cache-read-tokens", "5"])  # fmt: skip
    assert refused.exit_code == 2


def test_issue20_item4_compacted_history_keeps_cached_tokens(tmp_path: Path) -> None:
    home, clock = _home(tmp_path), Clock()
    led = _open(home, clock)
    try:
        res = led.reserve("s1", "anth/sonnet", input_bytes=10)
        led.settle(res.id, Success(1, 2, cache_write_tokens=3, cache_read_tokens=4))
        clock.advance(3 * 86_400_000)
        assert compact(led.db, clock(), 86_400_000).folded == 1
    finally:
        led.close()
    doc = json.loads(_status(home, "--json"))
    (day,) = doc["history"]
    assert (day["input_tokens"], day["cache_write_tokens"], day["cache_read_tokens"]) == (1, 3, 4)
    assert doc["daily"]["cache_read_tokens"] == 0
    text = _status(home)
    assert max(len(line) for line in text.splitlines()) <= 100
    header = next(line for line in text.splitlines() if "input tok" in line)
    assert "cache wr" in header
    assert "cache rd" in header
