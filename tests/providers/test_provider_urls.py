"""Issue 13 item 1: a credential goes only to its own provider's host; no default base URL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from click.testing import CliRunner, Result

from ledger.catalog import Catalog, NoBaseUrlError, known_base_url, known_providers
from ledger.cli.main import cli
from ledger.litellm import convert
from ledger.providers import CallRequest, Message, adapter_for

SECRET = "sk-issue13-never-sent-anywhere"
ENV = {"NOURL_API_KEY": SECRET, "MISTRAL_API_KEY": SECRET}
MESSAGES = (Message("user", "hello"),)

CATALOG: dict[str, Any] = {
    "providers": {
        "mistral": {"credentialEnv": "MISTRAL_API_KEY"},  # known: resolved by name
        "nourl": {"credentialEnv": "NOURL_API_KEY"},  # unknown and no baseUrl
        "local": {"available": True, "baseUrl": "http://127.0.0.1:9/v1"},
    },
    "models": [
        {"provider": "mistral", "id": "mistral-small", "pricing": [
            {"inputUsdPerMTok": 0.1, "outputUsdPerMTok": 0.3}]},
        {"provider": "nourl", "id": "m", "pricing": [
            {"inputUsdPerMTok": 0.01, "outputUsdPerMTok": 0.01}]},
        {"provider": "local", "id": "llama"},
    ],
}  # fmt: skip


def invoke(home: Path, *args: str) -> Result:
    env = {"NOURL_API_KEY": SECRET, "MISTRAL_API_KEY": SECRET}
    return CliRunner().invoke(cli, ["--home", str(home), *args], env=env)


@pytest.fixture
def nourl_home(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    (path / "catalog.json").write_text(json.dumps(CATALOG))
    assert invoke(path, "db", "upgrade").exit_code == 0  # reads never create a ledger (issue 15)
    return path


def test_issue13_item1_adapter_without_base_url_sends_nothing() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}]})

    provider = Catalog.model_validate(CATALOG).providers["nourl"]
    request = CallRequest("m", MESSAGES, 7, 10_000)
    transport = httpx.MockTransport(handler)
    with httpx.Client(transport=transport) as client, pytest.raises(NoBaseUrlError) as info:
        adapter_for(provider, ENV, client=client).call(request, now_ms=lambda: 0)
    assert sent == []
    assert SECRET not in str(info.value)


def test_issue13_item1_catalog_resolves_known_urls_and_refuses_unknown() -> None:
    catalog = Catalog.model_validate(CATALOG)
    assert catalog.providers_without_base_url() == frozenset({"nourl"})
    resolved = catalog.provider_for_call("mistral")
    assert resolved.base_url == "https://api.mistral.ai/v1"
    assert catalog.provider_for_call("local").base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(NoBaseUrlError):
        catalog.provider_for_call("nourl")


def test_issue13_item1_known_urls_only_for_their_own_api() -> None:
    assert known_base_url("anthropic", "anthropic-messages") == "https://api.anthropic.com"
    assert known_base_url("anthropic", "openai-chat") is None
    assert known_base_url("bedrock", "openai-chat") is None


@pytest.mark.parametrize(
    ("name", "host"),
    [
        ("openai", "api.openai.com"),
        ("mistral", "api.mistral.ai"),
        ("deepseek", "api.deepseek.com"),
        ("groq", "api.groq.com"),
        ("together_ai", "api.together.xyz"),
        ("fireworks_ai", "api.fireworks.ai"),
        ("openrouter", "openrouter.ai"),
        ("xai", "api.x.ai"),
        ("gemini", "generativelanguage.googleapis.com"),
    ],
)
def test_issue13_item1_ships_known_base_urls(name: str, host: str) -> None:
    api, url = known_providers()[name]
    assert api == "openai-chat"
    assert urlsplit(url).hostname == host


def test_issue13_item1_known_urls_are_https_and_distinct_from_openai() -> None:
    for name, (api, url) in known_providers().items():
        assert api in ("openai-chat", "anthropic-messages")
        assert url.startswith("https://")
        assert not url.endswith("/")
        if name != "openai":
            assert urlsplit(url).hostname != "api.openai.com", name


def test_issue13_item1_import_gives_known_urls_and_none_to_the_rest() -> None:
    document = {
        f"{p}/m": {"litellm_provider": p, "mode": "chat", "input_cost_per_token": 1e-7}
        for p in ("mistral", "gemini", "deepseek", "anthropic", "bedrock", "azure")
    }
    catalog = convert(document).catalog
    urls = {name: p.base_url for name, p in catalog.providers.items()}
    assert urls == {
        "anthropic": "https://api.anthropic.com",
        "azure": None,
        "bedrock": None,
        "deepseek": "https://api.deepseek.com/v1",
        "gemini": "https://generativelanguage.googleapis.com/v1beta/openai",
        "mistral": "https://api.mistral.ai/v1",
    }
    assert catalog.providers["anthropic"].api == "anthropic-messages"
    assert catalog.providers_without_base_url() == frozenset({"azure", "bedrock"})


def test_issue13_item1_select_status_validate_show_report_no_base_url(nourl_home: Path) -> None:
    # reads create nothing (issue 15): the ledger is created first
    assert invoke(nourl_home, "db", "upgrade").exit_code == 0
    selected = invoke(nourl_home, "select", "s1", "--model", "mistral/mistral-small", "--json")
    assert selected.exit_code == 0, selected.output
    doc = json.loads(selected.stdout)
    assert "nourl/m" not in doc["routes"]
    assert doc["routes"][0] == "mistral/mistral-small"
    reasons = {e["model"]: e["reason"] for e in doc["excluded"]}
    assert reasons["nourl/m"] == "no_base_url"

    status = invoke(nourl_home, "status", "--json")
    assert status.exit_code == 0, status.output
    excluded = {e["model"]: e["reason"] for e in json.loads(status.stdout)["excluded"]}
    assert excluded["nourl/m"] == "no_base_url"

    validate = invoke(nourl_home, "config", "validate", "--json")
    assert validate.exit_code == 0, validate.output
    assert json.loads(validate.stdout)["providers_without_base_url"] == ["nourl"]
    text = invoke(nourl_home, "config", "validate")
    assert "no_base_url): nourl" in text.stdout

    show = invoke(nourl_home, "catalog", "show", "--json")
    urls = {p["name"]: p["baseUrl"] for p in json.loads(show.stdout)["providers"]}
    assert urls == {
        "mistral": "https://api.mistral.ai/v1",
        "nourl": None,
        "local": "http://127.0.0.1:9/v1",
    }
    for result in (selected, status, validate, text, show):
        assert SECRET not in result.output


@pytest.mark.parametrize("as_json", [True, False])
def test_issue13_item1_catalog_show_never_prints_a_password_in_base_url(
    tmp_path: Path, as_json: bool
) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    catalog = {
        "providers": {
            "proxy": {"available": True, "baseUrl": f"https://team:{SECRET}@proxy.example/v1"},
            "plain": {"available": True, "baseUrl": "https://proxy.example:8443/v1?x=1"},
        },
        "models": [{"provider": "proxy", "id": "m"}],
    }
    (home / "catalog.json").write_text(json.dumps(catalog))
    result = invoke(home, "catalog", "show", *(["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    if as_json:
        urls = {p["name"]: p["baseUrl"] for p in json.loads(result.stdout)["providers"]}
        assert urls == {
            # issue 20 item 10: the whole userinfo and every query value are masked
            "proxy": "https://***@proxy.example/v1",
            "plain": "https://proxy.example:8443/v1?x=***",
        }
    else:
        assert "baseUrl=https://***@proxy.example/v1" in result.stdout
