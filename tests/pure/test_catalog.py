"""R-CAT-1..3: the catalog format, availability from credentials, fail-closed validation."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from ledger.catalog import Catalog, example_catalog, parse_catalog, split_model_key
from ledger.errors import ConfigError, UsageError
from tests.support.ledgers import TEST_CATALOG

SECRET = "sk-ant-SECRET-VALUE-zzzz"


def test_r_cat_1_spec_example_parses() -> None:
    spec_example = {
        "providers": {
            "openai": {
                "credentialEnv": "OPENAI_API_KEY",
                "api": "openai-chat",
                "baseUrl": "https://api.openai.com/v1",
            },
            "local": {
                "available": True,
                "api": "openai-chat",
                "baseUrl": "http://127.0.0.1:8080/v1",
            },
        },
        "models": [
            {
                "provider": "openai",
                "id": "gpt-4.1-mini",
                "input": ["text"],
                "output": ["text"],
                "contextWindow": 1047576,
                "maxOutputTokens": 32768,
                "reasoning": False,
                "pricing": [{"inputUsdPerMTok": 0.4, "outputUsdPerMTok": 1.6}],
            },
            {
                "provider": "local",
                "id": "llama-3.1-8b",
                "input": ["text"],
                "output": ["text"],
                "contextWindow": 131072,
                "maxOutputTokens": 8192,
                "reasoning": False,
            },
        ],
    }
    catalog = parse_catalog(json.dumps(spec_example))
    assert catalog.model("local/llama-3.1-8b") is not None
    assert not catalog.model("local/llama-3.1-8b").price_known()  # type: ignore[union-attr]
    assert example_catalog().models


def test_r_cat_1_tiers_and_highest_prices() -> None:
    catalog = Catalog.model_validate(TEST_CATALOG)
    big = catalog.require_model("alpha/big")
    assert big.max_prices() == (Decimal("6"), Decimal("22.5"))
    assert catalog.require_model("beta/free/unknown").max_prices() is None


def test_model_key_splits_at_first_slash() -> None:
    assert split_model_key("beta/free/unknown") == ("beta", "free/unknown")
    with pytest.raises(UsageError):
        split_model_key("nokey")


def test_r_cat_2_availability_from_env_never_stored() -> None:
    catalog = Catalog.model_validate(TEST_CATALOG)
    assert "gamma" not in catalog.available_providers({})
    assert "gamma" not in catalog.available_providers({"GAMMA_TEST_KEY": ""})
    assert "gamma" in catalog.available_providers({"GAMMA_TEST_KEY": SECRET})
    assert SECRET not in json.dumps(catalog.to_json())
    assert SECRET not in repr(catalog)


def _with(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(TEST_CATALOG))
    for path, value in changes.items():
        target: Any = doc
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        last = keys[-1]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return doc


BAD = [
    ("unknown provider key", _with(providers__alpha={"available": True, "apiKey": SECRET})),
    ("provider without availability", _with(providers__alpha={"api": "openai-chat"})),
    ("bad api", _with(providers__alpha={"available": True, "api": SECRET})),
    ("bad credential env name", _with(providers__gamma={"credentialEnv": SECRET + " x"})),
    ("negative price", _with(models__0__pricing=[{"inputUsdPerMTok": -1, "outputUsdPerMTok": 1}])),
    (
        "tier order",
        _with(
            models__0__pricing=[
                {"inputUsdPerMTok": 1, "outputUsdPerMTok": 1},
                {"inputUsdPerMTok": 1, "outputUsdPerMTok": 1},
            ]
        ),
    ),
    (
        "unbounded first tier",
        _with(
            models__0__pricing=[
                {"upToInputTokens": 10, "inputUsdPerMTok": 1, "outputUsdPerMTok": 1}
            ]
        ),
    ),
    ("model of unknown provider", _with(models__0__provider="nobody")),
    ("duplicate model", _with(models__1=TEST_CATALOG["models"][0])),
    ("zero window", _with(models__0__contextWindow=0)),
    ("string window", _with(models__0__contextWindow=SECRET)),
]


@pytest.mark.parametrize(("label", "doc"), BAD, ids=[b[0] for b in BAD])
def test_r_cat_1_invalid_catalog_fails_closed_without_echo(label: str, doc: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_catalog(json.dumps(doc), "catalog.json")
    assert SECRET not in info.value.message
    assert info.value.message.startswith("catalog.json: ")
