"""Issue 20 items 10 and 11: what reaches a terminal. Every credential-bearing part of a URL is
masked wherever a URL is shown, and a name with control characters is refused, never printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.validation import printable, shown_url

TOKEN = "sk-live-51HxQ2eZvKYlo2C0123456789abcdef"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.example.com/v1", "https://api.example.com/v1"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1"),
        (f"https://{TOKEN}@host.example/v1", "https://***@host.example/v1"),
        (f"https://user:{TOKEN}@host.example/v1", "https://***@host.example/v1"),
        (f"https://host.example/v1?api-key={TOKEN}", "https://host.example/v1?api-key=***"),
        (f"https://h.example/v1?key={TOKEN}&x=1", "https://h.example/v1?key=***&x=***"),
        (f"https://h.example/v1?token={TOKEN}", "https://h.example/v1?token=***"),
        (f"https://h.example/v1?{TOKEN}", "https://h.example/v1?***"),
        (f"https://h.example/v1#{TOKEN}", "https://h.example/v1#***"),
        (f"https://h.example/bot{TOKEN}/v1", "https://h.example/***/v1"),
        (f"https://h.example/v1?{TOKEN}=1", "https://h.example/v1?***=***"),
        ("https://h.example/openai/deployments/gpt-4o/", "https://h.example/openai/deployments/gpt-4o/"),
        (f"https://[::1/{TOKEN}", "https://***"),
        ("https://h.example/\x1b[31mred", "https://h.example/?[31mred"),
    ],
)
def test_issue20_item10_every_credential_part_masked(url: str, expected: str) -> None:
    assert shown_url(url) == expected
    assert TOKEN not in shown_url(url)


def test_issue20_item11_printable_replaces_control_characters() -> None:
    assert printable("a\x1b[2Jb\u202ec\nd") == "a?[2Jb?c?d"
    assert printable("plain text") == "plain text"


def _catalog(home: Path, providers: dict[str, object], models: list[object]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.json").write_text(json.dumps({"providers": providers, "models": models}))


@pytest.mark.parametrize(
    "url",
    [
        f"https://{TOKEN}@llm.example/v1",
        f"https://llm.example/v1?api-key={TOKEN}",
        f"https://llm.example/v1?key={TOKEN}",
        f"https://llm.example/v1#token={TOKEN}",
    ],
)
def test_issue20_item10_catalog_show_masks_text_and_json(tmp_path: Path, url: str) -> None:
    home = tmp_path / "h"
    _catalog(home, {"p": {"available": True, "baseUrl": url}}, [{"provider": "p", "id": "m"}])
    for args in (("catalog", "show"), ("catalog", "show", "--json")):
        result = CliRunner().invoke(cli, ["--home", str(home), *args])
        assert result.exit_code == 0, result.output
        assert TOKEN not in result.output
        assert "llm.example" in result.output


ESC = "\x1b[2J\x1b[31m"


def _config_validate(home: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--home", str(home), "config", "validate"])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("providers", "models", "path"),
    [
        ({"p": {"available": True}}, [{"provider": "p", "id": f"m{ESC}"}], "models[0].id"),
        ({f"p{ESC}": {"available": True}}, [], "providers.<key>"),
        ({"p": {"available": True}}, [{"provider": f"p{ESC}", "id": "m"}], "models[0].provider"),
        (
            {"p": {"available": True, "baseUrl": f"https://h.example/{ESC}"}},
            [],
            "providers.<key>.baseUrl",
        ),
    ],
)
def test_issue20_item11_catalog_name_with_control_characters_is_refused(
    tmp_path: Path, providers: dict[str, object], models: list[object], path: str
) -> None:
    home = tmp_path / "h"
    _catalog(home, providers, models)
    code, output = _config_validate(home)
    assert code == 2
    assert output.count("\n") == 1, output
    assert f"catalog.json: {path}" in output
    assert "\x1b" not in output


@pytest.mark.parametrize("field", ["defaultModel", "fallbackModels"])
def test_issue20_item11_policy_model_key_with_control_characters_is_refused(
    tmp_path: Path, field: str
) -> None:
    home = tmp_path / "h"
    home.mkdir()
    key = f"p/m{ESC}"
    value: object = [key] if field == "fallbackModels" else key
    (home / "recovery.json").write_text(json.dumps({field: value}))
    code, output = _config_validate(home)
    assert code == 2
    assert output.count("\n") == 1
    assert field in output
    assert "\x1b" not in output


def test_issue20_item11_import_skips_unprintable_names_with_a_count(tmp_path: Path) -> None:
    litellm = {
        "good-x": {"litellm_provider": "openai", "mode": "chat"},
        f"evil{ESC}": {"litellm_provider": "openai", "mode": "chat"},
        "evil-provider": {"litellm_provider": f"openai{ESC}", "mode": "chat"},
    }
    source = tmp_path / "prices.json"
    source.write_text(json.dumps(litellm))
    home = tmp_path / "h"
    runner = CliRunner()
    text = runner.invoke(cli, ["--home", str(home), "catalog", "import-litellm", str(source)])
    assert text.exit_code == 0, text.output
    assert "\x1b" not in text.output
    assert "unprintable_name 2" in text.output
    doc = json.loads(
        runner.invoke(
            cli, ["--home", str(home), "catalog", "import-litellm", str(source), "--json"]
        ).output
    )
    assert doc["skippedByReason"] == {"unprintable_name": 2}
    assert "\x1b" not in (home / "catalog.json").read_text()
    shown = runner.invoke(cli, ["--home", str(home), "catalog", "show"])
    assert shown.exit_code == 0
    assert "\x1b" not in shown.output
