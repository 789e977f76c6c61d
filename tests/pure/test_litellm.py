"""R-CAT-4: converting LiteLLM's price map into a catalog (pure converter and merge)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.catalog import Catalog, Model, PriceTier, Provider, dump_catalog, parse_catalog
from ledger.errors import UsageError
from ledger.litellm import ImportResult, convert, credential_env_for, merge, parse_litellm

SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "litellm-prices-sample.json"


def _chat(provider: str = "openai", **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "litellm_provider": provider,
        "mode": "chat",
        "input_cost_per_token": 1e-06,
        "output_cost_per_token": 2e-06,
    }
    entry.update(fields)
    return entry


FIXTURE: dict[str, Any] = {
    "sample_spec": {"litellm_provider": "one of ...", "mode": "chat", "max_tokens": "LEGACY"},
    "gpt-4.1-mini": _chat(
        input_cost_per_token=4e-07,
        output_cost_per_token=1.6e-06,
        cache_read_input_token_cost=1e-07,
        input_cost_per_token_batches=2e-07,
        input_cost_per_token_priority=7e-07,
        max_input_tokens=1047576,
        max_output_tokens=32768,
        max_tokens=32768,
        supports_vision=True,
        supports_reasoning=False,
    ),
    "claude-sonnet-4-5": _chat(
        "anthropic",
        input_cost_per_token=3e-06,
        output_cost_per_token=1.5e-05,
        input_cost_per_token_above_200k_tokens=6e-06,
        output_cost_per_token_above_200k_tokens=2.25e-05,
        input_cost_per_token_above_200k_tokens_priority=9e-06,
        cache_creation_input_token_cost_above_200k_tokens=7.5e-06,
        max_input_tokens=200000,
        max_output_tokens=64000,
        supports_reasoning=True,
        supports_pdf_input=True,
    ),
    "text-embedding-3-small": {
        "litellm_provider": "openai",
        "mode": "embedding",
        "input_cost_per_token": 2e-08,
    },
    "whisper-1": {"litellm_provider": "openai", "mode": "audio_transcription"},
    "broken-negative": _chat(input_cost_per_token=-1e-06),
    "broken-nan": _chat(output_cost_per_token=math.nan),
    "broken-string": _chat(input_cost_per_token="0.000001"),
    "broken-not-object": [1, 2, 3],
    "orphan": {"mode": "chat", "input_cost_per_token": 1e-06},
}


def _only(document: dict[str, Any], key: str) -> Model:
    result = convert(document)
    assert result.imported == 1, result.skipped_by_reason
    (model,) = result.catalog.models
    assert model.key == key
    return model


def _tiers(model: Model) -> list[tuple[int | None, float | None, float | None]]:
    return [
        (t.up_to_input_tokens, t.input_usd_per_mtok, t.output_usd_per_mtok)
        for t in model.pricing or []
    ]


# --- the small fixture ------------------------------------------------------------------------


def test_r_cat_4_fixture_counts_by_reason() -> None:
    result = convert(FIXTURE)
    assert isinstance(result, ImportResult)
    assert result.imported == 2
    assert dict(result.skipped_by_reason) == {
        "bad_entry": 4,
        "documentation": 1,
        "no_provider": 1,
        "not_chat": 2,
    }
    assert result.skipped == 8
    assert result.imported + result.skipped == len(FIXTURE)
    assert sorted(m.key for m in result.catalog.models) == [
        "anthropic/claude-sonnet-4-5",
        "openai/gpt-4.1-mini",
    ]


def test_r_cat_4_fixture_fields() -> None:
    catalog = convert(FIXTURE).catalog
    mini = catalog.require_model("openai/gpt-4.1-mini")
    assert _tiers(mini) == [(None, 0.4, 1.6)]  # batch, cache and priority prices ignored
    assert (mini.context_window, mini.max_output_tokens) == (1047576, 32768)
    assert mini.input == ["text", "image"]
    assert mini.output == ["text"]
    assert mini.reasoning is False
    sonnet = catalog.require_model("anthropic/claude-sonnet-4-5")
    assert _tiers(sonnet) == [(200000, 3.0, 15.0), (None, 6.0, 22.5)]
    assert sonnet.input == ["text", "pdf"]
    assert sonnet.reasoning is True


@pytest.mark.parametrize(
    ("per_token", "per_mtok"),
    [
        (3e-06, 3.0),
        (1.5e-05, 15.0),
        (2.25e-05, 22.5),
        (4e-07, 0.4),
        (9.54e-07, 0.954),
        (3.961e-06, 3.961),
        (7.5e-08, 0.075),
        (1.1e-06, 1.1),
        (0, 0.0),
        (1, 1_000_000.0),
        (1.23456789e-06, 1.234568),  # rounded to 6 decimals
    ],
)
def test_r_cat_4_price_per_mtok_exact(per_token: float, per_mtok: float) -> None:
    model = _only({"m": _chat(input_cost_per_token=per_token)}, "openai/m")
    assert model.pricing is not None
    assert model.pricing[0].input_usd_per_mtok == per_mtok


@pytest.mark.parametrize(
    ("fields", "tiers"),
    [
        pytest.param(
            {"input_cost_per_token_above_128k_tokens": 2e-06,
             "output_cost_per_token_above_128k_tokens": 4e-06},
            [(128000, 1.0, 2.0), (None, 2.0, 4.0)],
            id="one-threshold",
        ),
        pytest.param(
            {"input_cost_per_token_above_272k_tokens": 4e-06,
             "output_cost_per_token_above_272k_tokens": 8e-06,
             "input_cost_per_token_above_128k_tokens": 2e-06,
             "output_cost_per_token_above_128k_tokens": 3e-06},
            [(128000, 1.0, 2.0), (272000, 2.0, 3.0), (None, 4.0, 8.0)],
            id="two-thresholds-ordered",
        ),
        pytest.param(
            {"input_cost_per_token_above_200k_tokens": 2e-06},
            [(200000, 1.0, 2.0), (None, 2.0, 2.0)],
            id="one-sided-keeps-other-price",
        ),
        pytest.param(
            {"input_cost_per_token_above_200k_tokens_priority": 9e-06,
             "cache_read_input_token_cost_above_200k_tokens_priority": 9e-06,
             "input_cost_per_token_flex": 9e-06},
            [(None, 1.0, 2.0)],
            id="priority-flex-ignored",  # cache prices are imported since issue 20
        ),
    ],
)
def test_r_cat_4_tiers(
    fields: dict[str, Any], tiers: list[tuple[int | None, float, float]]
) -> None:
    assert _tiers(_only({"m": _chat(**fields)}, "openai/m")) == tiers


def test_r_cat_4_unknown_price_when_absent() -> None:
    model = _only(
        {"m": {"litellm_provider": "local", "mode": "chat", "max_tokens": 8192}}, "local/m"
    )
    assert model.pricing is None
    assert not model.price_known()
    half = _only({"m": _chat(output_cost_per_token=None)}, "openai/m")
    assert _tiers(half) == [(None, 1.0, None)]


@pytest.mark.parametrize(
    ("fields", "window", "max_output"),
    [
        ({"max_input_tokens": 1000, "max_output_tokens": 10, "max_tokens": 10}, 1000, 10),
        ({"max_tokens": 4096}, 4096, None),  # the only size given: the window
        ({"max_output_tokens": 10, "max_tokens": 10}, None, 10),  # max_tokens is the output
        ({"max_input_tokens": 2048.0}, 2048, None),  # integral float accepted
        ({}, None, None),
    ],
)
def test_r_cat_4_sizes(fields: dict[str, Any], window: int | None, max_output: int | None) -> None:
    model = _only({"m": _chat(**fields)}, "openai/m")
    assert (model.context_window, model.max_output_tokens) == (window, max_output)


@pytest.mark.parametrize(
    ("key", "provider", "model_id"),
    [
        ("openai/gpt-x", "openai", "gpt-x"),
        ("openrouter/anthropic/claude-x", "openrouter", "anthropic/claude-x"),
        ("anthropic/claude-x", "bedrock", "anthropic/claude-x"),
        ("claude-x-v1:0", "bedrock", "claude-x-v1:0"),
    ],
)
def test_r_cat_4_model_key(key: str, provider: str, model_id: str) -> None:
    _only({key: _chat(provider)}, f"{provider}/{model_id}")


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param("not an object", id="string"),
        pytest.param(None, id="null"),
        pytest.param(_chat(input_cost_per_token=-1e-06), id="negative-price"),
        pytest.param(_chat(input_cost_per_token=math.nan), id="nan-price"),
        pytest.param(_chat(output_cost_per_token=math.inf), id="inf-price"),
        pytest.param(_chat(input_cost_per_token="1e-6"), id="string-price"),
        pytest.param(_chat(input_cost_per_token=True), id="bool-price"),
        pytest.param(_chat(input_cost_per_token=2), id="absurd-price"),
        pytest.param(_chat(input_cost_per_token=10**400), id="huge-int-price"),
        pytest.param(_chat(input_cost_per_token_above_200k_tokens=-1.0), id="negative-tier"),
        pytest.param(_chat(input_cost_per_token_above_0k_tokens=1e-06), id="zero-threshold"),
        pytest.param(_chat(max_input_tokens=-5), id="negative-window"),
        pytest.param(_chat(max_input_tokens=0), id="zero-window"),
        pytest.param(_chat(max_output_tokens=10.5), id="fractional-output"),
        pytest.param(_chat(max_output_tokens="4096"), id="string-output"),
        pytest.param(_chat(supports_reasoning="yes"), id="string-flag"),
        pytest.param(_chat("bad provider"), id="space-in-provider"),
        pytest.param(_chat("a/b"), id="slash-in-provider"),
    ],
)
def test_r_cat_4_bad_entry_skipped(entry: object) -> None:
    result = convert({"ok": _chat(), "bad": entry})
    assert result.imported == 1
    assert dict(result.skipped_by_reason) == {"bad_entry": 1}


def test_r_cat_4_bad_model_id_skipped() -> None:
    result = convert({"has space": _chat(), "openai/": _chat(), "x" * 201: _chat()})
    assert result.imported == 0
    assert dict(result.skipped_by_reason) == {"bad_entry": 3}


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({"mode": "embedding", "litellm_provider": "openai"}, "not_chat"),
        ({"litellm_provider": "openai"}, "not_chat"),
        ({"mode": "chat"}, "no_provider"),
        ({"mode": "chat", "litellm_provider": ""}, "no_provider"),
        ({"mode": "chat", "litellm_provider": 7}, "no_provider"),
    ],
)
def test_r_cat_4_skip_reasons(entry: dict[str, Any], reason: str) -> None:
    assert dict(convert({"m": entry}).skipped_by_reason) == {reason: 1}


def test_r_cat_4_providers_filter() -> None:
    result = convert(FIXTURE, frozenset({"anthropic"}))
    assert [m.key for m in result.catalog.models] == ["anthropic/claude-sonnet-4-5"]
    assert result.skipped_by_reason["filtered"] == 4  # openai chat entries, broken or not
    assert set(result.catalog.providers) == {"anthropic"}


def test_r_cat_4_duplicate_key_first_wins() -> None:
    result = convert(
        {
            "openai/gpt-x": _chat(input_cost_per_token=1e-06),
            "gpt-x": _chat(input_cost_per_token=5e-06),
        }
    )
    assert result.imported == 1
    assert dict(result.skipped_by_reason) == {"duplicate": 1}
    assert _tiers(result.catalog.models[0])[0][1] == 1.0


@pytest.mark.parametrize(
    ("name", "credential_env", "api", "base_url"),
    [
        ("openai", "OPENAI_API_KEY", "openai-chat", "https://api.openai.com/v1"),
        ("anthropic", "ANTHROPIC_API_KEY", "anthropic-messages", "https://api.anthropic.com"),
        ("vertex_ai-language-models", "VERTEX_AI_LANGUAGE_MODELS_API_KEY", "openai-chat", None),
        ("01.ai", "_01_AI_API_KEY", "openai-chat", None),
    ],
)
def test_r_cat_4_imported_providers(
    name: str, credential_env: str, api: str, base_url: str | None
) -> None:
    assert credential_env_for(name) == credential_env
    provider = convert({"m": _chat(name)}).catalog.providers[name]
    assert provider == Provider(credential_env=credential_env, api=api, base_url=base_url)
    assert provider.available is None


@pytest.mark.parametrize(
    "text",
    [b"{not json", b"[1, 2]", b"\"SECRET-sk-123\"", b"\xff\xfe\x00garbage", b"[" * 100_000],
)
def test_r_cat_4_parse_rejects_without_echo(text: bytes) -> None:
    with pytest.raises(UsageError) as info:
        parse_litellm(text)
    assert "SECRET" not in info.value.message
    assert "garbage" not in info.value.message


def test_r_cat_4_convert_rejects_non_object() -> None:
    with pytest.raises(UsageError):
        convert([1, 2, 3])


# --- merge --------------------------------------------------------------------------------------


def _existing() -> Catalog:
    return Catalog(
        providers={
            "openai": Provider(available=True, base_url="http://proxy.local/v1",
                               options={"organization": "org-1"}),
            "mine": Provider(available=True),
        },
        models=[
            Model(provider="openai", id="gpt-4.1-mini", input=["text"], reasoning=True,
                  context_window=1000, pricing=[PriceTier(input_usd_per_mtok=9,
                                                          output_usd_per_mtok=9)]),
            Model(provider="openai", id="kept-unknown", context_window=777, max_output_tokens=77),
            Model(provider="mine", id="local-only"),
        ],
    )


def test_r_cat_4_merge_keeps_hand_set_and_updates_prices() -> None:
    imported = convert(
        {**FIXTURE, "kept-unknown": {"litellm_provider": "openai", "mode": "chat"}}
    ).catalog
    merged = merge(_existing(), imported)
    assert merged.providers["openai"] == _existing().providers["openai"]  # never lost
    assert merged.providers["mine"].available is True
    assert merged.providers["anthropic"].credential_env == "ANTHROPIC_API_KEY"
    mini = merged.require_model("openai/gpt-4.1-mini")
    assert _tiers(mini) == [(None, 0.4, 1.6)]
    assert (mini.context_window, mini.max_output_tokens) == (1047576, 32768)
    assert mini.reasoning is True  # hand-set non-price fields are kept
    assert mini.input == ["text"]
    kept = merged.require_model("openai/kept-unknown")
    assert (kept.context_window, kept.max_output_tokens) == (777, 77)  # unknown erases nothing
    assert merged.model("mine/local-only") is not None
    assert merged.model("anthropic/claude-sonnet-4-5") is not None
    assert [m.key for m in merged.models][:3] == [m.key for m in _existing().models]
    assert parse_catalog(dump_catalog(merged)) == merged


def test_r_cat_4_merge_is_idempotent() -> None:
    imported = convert(FIXTURE).catalog
    once = merge(_existing(), imported)
    assert merge(once, imported) == once


# --- the real 218-entry sample ------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample() -> dict[str, Any]:
    if not SAMPLE.is_file():
        pytest.skip(f"real LiteLLM sample not found at {SAMPLE} (shared data not checked out)")
    data: dict[str, Any] = json.loads(SAMPLE.read_text())
    return data


def test_r_cat_4_sample_imports_only_chat(sample: dict[str, Any]) -> None:
    result = convert(sample)
    chat = {k for k, v in sample.items() if isinstance(v, dict) and v.get("mode") == "chat"}
    assert result.imported == len(chat)
    assert {m.id for m in result.catalog.models} == chat
    assert result.skipped_by_reason["not_chat"] == len(sample) - len(chat)
    assert result.imported + result.skipped == len(sample)
    assert parse_catalog(dump_catalog(result.catalog)) == result.catalog


@pytest.mark.parametrize(
    ("key", "tiers", "window", "max_output", "reasoning"),
    [
        ("openai/gpt-4.1-mini", [(None, 0.4, 1.6)], 1047576, 32768, False),
        ("openai/gpt-4o", [(None, 2.5, 10.0)], 128000, 16384, False),
        ("anthropic/claude-haiku-4-5", [(None, 1.0, 5.0)], 200000, 64000, True),
        ("moonshot/kimi-k2.6", [(None, 0.954, 3.961)], 1000000, 384000, True),
        ("anthropic/claude-sonnet-4-5", [(200000, 3.0, 15.0), (None, 6.0, 22.5)], 200000, 64000,
         True),
        ("vertex_ai-language-models/gemini-2.5-pro", [(200000, 1.25, 10.0), (None, 2.5, 15.0)],
         1048576, 65535, True),
        ("openai/gpt-5.4", [(272000, 2.5, 15.0), (None, 5.0, 22.5)], 1050000, 128000, True),
        ("vertex_ai-language-models/gemini-3-pro-preview",
         [(200000, 2.0, 12.0), (None, 4.0, 18.0)], 1048576, 65535, True),
    ],
)
def test_r_cat_4_sample_known_models(
    sample: dict[str, Any],
    key: str,
    tiers: list[tuple[int | None, float, float]],
    window: int,
    max_output: int,
    reasoning: bool,
) -> None:
    model = convert(sample).catalog.require_model(key)
    assert _tiers(model) == tiers
    assert (model.context_window, model.max_output_tokens) == (window, max_output)
    assert model.reasoning is reasoning


def test_r_cat_4_sample_every_200k_model_has_two_tiers(sample: dict[str, Any]) -> None:
    catalog = convert(sample).catalog
    tiered = [
        k for k, v in sample.items()
        if v.get("mode") == "chat" and "input_cost_per_token_above_200k_tokens" in v
    ]
    assert tiered
    for key in tiered:
        model = catalog.require_model(f"{sample[key]['litellm_provider']}/{key}")
        assert model.pricing is not None
        assert len(model.pricing) == 2
        assert model.pricing[0].up_to_input_tokens == 200000


def test_r_cat_4_sample_merge_keeps_available_provider(sample: dict[str, Any]) -> None:
    merged = merge(_existing(), convert(sample).catalog)
    assert merged.providers["openai"].available is True
    assert merged.providers["openai"].credential_env is None
    assert merged.available_providers({}) >= {"openai", "mine"}
    assert merged.model("mine/local-only") is not None
    assert parse_catalog(dump_catalog(merged)) == merged


# --- property: arbitrary JSON never crashes the converter ---------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8,
)
_field_names = st.sampled_from([
    "litellm_provider", "mode", "input_cost_per_token", "output_cost_per_token",
    "max_input_tokens", "max_output_tokens", "max_tokens", "supports_reasoning",
    "supports_vision", "supports_pdf_input", "supports_audio_input",
    "input_cost_per_token_above_200k_tokens", "output_cost_per_token_above_128k_tokens",
    "input_cost_per_token_above_0k_tokens", "output_cost_per_token_above_999999999m_tokens",
])
_entry = st.fixed_dictionaries(
    {"mode": st.just("chat") | _json, "litellm_provider": st.sampled_from(["openai", "x y", ""])
     | st.text(max_size=4)},
    optional={"extra": _json},
).flatmap(lambda base: st.dictionaries(_field_names, _json, max_size=6).map(
    lambda extra: {**base, **extra}))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=12), _entry | _json, max_size=6))
def test_r_cat_4_property_never_crashes(document: dict[str, Any]) -> None:
    result = convert(document)
    assert result.imported + result.skipped == len(document)
    assert result.imported == len(result.catalog.models)
    assert parse_catalog(dump_catalog(result.catalog)) == result.catalog


@settings(max_examples=100, deadline=None)
@given(_json)
def test_r_cat_4_property_any_document(document: object) -> None:
    if not isinstance(document, dict):
        with pytest.raises(UsageError):
            convert(document)
        return
    result = convert(document)
    assert result.imported + result.skipped == len(document)
