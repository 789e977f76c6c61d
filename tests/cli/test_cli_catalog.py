"""R-CAT-1, R-CAT-2, R-CAT-4: `ledger catalog import-litellm | init | show` through click."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ledger.catalog import CATALOG_FILE, dump_catalog, example_catalog, load_catalog
from ledger.cli.catalog_cmd import catalog
from ledger.cli.main import cli

SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "litellm-prices-sample.json"
SECRET = "sk-test-SECRET-value-0123456789"

cli.add_command(catalog)  # idempotent; ledger.cli.commands registers the same group

FIXTURE: dict[str, Any] = {
    "sample_spec": {"mode": "chat", "litellm_provider": "one of ..."},
    "gpt-x": {"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": 4e-07,
              "output_cost_per_token": 1.6e-06, "max_input_tokens": 1000,
              "max_output_tokens": 100},
    "claude-x": {"litellm_provider": "anthropic", "mode": "chat",
                 "input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05,
                 "input_cost_per_token_above_200k_tokens": 6e-06,
                 "output_cost_per_token_above_200k_tokens": 2.25e-05},
    "embed-x": {"litellm_provider": "openai", "mode": "embedding"},
    "broken": {"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": -1},
}


def _invoke(home: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), "catalog", *args], env=env)


def _write(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document))
    return path


def _files(home: Path) -> list[str]:
    return sorted(p.name for p in home.iterdir()) if home.exists() else []


def test_r_cat_4_import_writes_loadable_catalog(tmp_path: Path) -> None:
    home = tmp_path / "state"
    source = _write(tmp_path / "prices.json", FIXTURE)
    result = _invoke(home, "import-litellm", str(source), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report == {
        "imported": 2,
        "skipped": 3,
        "skippedByReason": {"bad_entry": 1, "documentation": 1, "not_chat": 1},
        "aliases": 0,
        "conflictingDuplicates": [],
        "totalModels": 2,
        "totalProviders": 2,
        "written": True,
    }
    loaded = load_catalog(home)
    assert {m.key for m in loaded.models} == {"openai/gpt-x", "anthropic/claude-x"}
    claude = loaded.require_model("anthropic/claude-x")
    assert claude.pricing is not None
    assert [t.up_to_input_tokens for t in claude.pricing] == [200000, None]
    assert _files(home) == [CATALOG_FILE]  # no temporary file left behind


def test_r_cat_4_import_text_output(tmp_path: Path) -> None:
    source = _write(tmp_path / "prices.json", FIXTURE)
    result = _invoke(tmp_path / "state", "import-litellm", str(source))
    assert result.exit_code == 0, result.output
    assert "imported 2 chat models" in result.stdout
    assert "skipped 3 (bad_entry 1, documentation 1, not_chat 1)" in result.stdout
    assert "catalog: 2 models, 2 providers" in result.stdout


def test_r_cat_4_import_providers_option(tmp_path: Path) -> None:
    home = tmp_path / "state"
    source = _write(tmp_path / "prices.json", FIXTURE)
    result = _invoke(home, "import-litellm", str(source), "--providers", " anthropic, ,", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["skippedByReason"]["filtered"] == 2
    assert [m.key for m in load_catalog(home).models] == ["anthropic/claude-x"]


def test_r_cat_4_dry_run_writes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "state"
    source = _write(tmp_path / "prices.json", FIXTURE)
    result = _invoke(home, "import-litellm", str(source), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["written"] is False
    assert json.loads(result.stdout)["totalModels"] == 2
    assert not home.exists()


def test_r_cat_4_merge_keeps_hand_set_provider(tmp_path: Path) -> None:
    home = tmp_path / "state"
    home.mkdir()
    hand: dict[str, Any] = {
        "providers": {"openai": {"available": True, "baseUrl": "http://proxy.local/v1",
                                 "options": {"organization": "org-1"}},
                      "local": {"available": True}},
        "models": [{"provider": "local", "id": "llama"},
                   {"provider": "openai", "id": "gpt-x", "pricing": [
                       {"inputUsdPerMTok": 99, "outputUsdPerMTok": 99}]}],
    }
    _write(home / CATALOG_FILE, hand)
    source = _write(tmp_path / "prices.json", FIXTURE)
    result = _invoke(home, "import-litellm", str(source))
    assert result.exit_code == 0, result.output
    merged = json.loads((home / CATALOG_FILE).read_text())
    assert merged["providers"]["openai"] == {**hand["providers"]["openai"], "api": "openai-chat"}
    assert merged["providers"]["local"] == {"available": True, "api": "openai-chat",
                                            "options": {}}
    assert merged["providers"]["anthropic"]["credentialEnv"] == "ANTHROPIC_API_KEY"
    models = {f"{m['provider']}/{m['id']}": m for m in merged["models"]}
    assert set(models) == {"local/llama", "openai/gpt-x", "anthropic/claude-x"}
    assert models["openai/gpt-x"]["pricing"] == [{"inputUsdPerMTok": 0.4, "outputUsdPerMTok": 1.6}]
    assert load_catalog(home).available_providers({}) == {"openai", "local"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(f'{{"{SECRET}": ', "not valid JSON", id="bad-json"),
        pytest.param(f'["{SECRET}"]', "must be a JSON object", id="not-object"),
        pytest.param(f'"{SECRET}"', "must be a JSON object", id="string"),
        pytest.param(None, "cannot be read", id="missing"),
        pytest.param("dir", "cannot be read", id="directory"),
    ],
)
def test_r_cat_4_bad_file_exit_2_nothing_written(
    tmp_path: Path, content: str | None, message: str
) -> None:
    home = tmp_path / "state"
    source = tmp_path / "prices.json"
    if content == "dir":
        source.mkdir()
    elif content is not None:
        source.write_text(content)
    for extra in ([], ["--json"]):
        result = _invoke(home, "import-litellm", str(source), *extra)
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert SECRET not in result.output
        assert len(result.output.strip().splitlines()) == (1 if not extra else 6)
    assert not home.exists()


def test_r_cat_4_invalid_existing_catalog_left_untouched(tmp_path: Path) -> None:
    home = tmp_path / "state"
    home.mkdir()
    broken = '{"providers": {"x": {"credentialEnv": "X", "api": "nope"}}}'
    (home / CATALOG_FILE).write_text(broken)
    source = _write(tmp_path / "prices.json", FIXTURE)
    result = _invoke(home, "import-litellm", str(source))
    assert result.exit_code == 2
    assert (home / CATALOG_FILE).read_text() == broken
    assert _files(home) == [CATALOG_FILE]


def test_r_cat_4_failed_replace_keeps_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "state"
    home.mkdir()
    old = dump_catalog(example_catalog())
    (home / CATALOG_FILE).write_text(old)
    source = _write(tmp_path / "prices.json", FIXTURE)

    def failing_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    result = _invoke(home, "import-litellm", str(source))
    assert result.exit_code == 2
    assert "cannot be written" in result.output
    assert (home / CATALOG_FILE).read_text() == old
    assert _files(home) == [CATALOG_FILE]


def test_r_cat_4_real_sample_through_cli(tmp_path: Path) -> None:
    if not SAMPLE.is_file():
        pytest.skip(f"real LiteLLM sample not found at {SAMPLE} (shared data not checked out)")
    home = tmp_path / "state"
    result = _invoke(home, "import-litellm", str(SAMPLE), "--json")
    assert result.exit_code == 0, result.output
    sample = json.loads(SAMPLE.read_text())
    chat = sum(1 for v in sample.values() if v.get("mode") == "chat")
    assert json.loads(result.stdout)["imported"] == chat
    loaded = load_catalog(home)
    assert len(loaded.models) == chat
    sonnet = loaded.require_model("anthropic/claude-sonnet-4-5")
    assert sonnet.max_prices() is not None


def test_r_cat_1_init_writes_example_and_refuses_overwrite(tmp_path: Path) -> None:
    home = tmp_path / "state"
    first = _invoke(home, "init", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {"written": True, "providers": 3, "models": 5}
    assert load_catalog(home) == example_catalog()
    (home / CATALOG_FILE).write_text(dump_catalog(load_catalog(home)).replace("0.4", "0.5"))
    again = _invoke(home, "init")
    assert again.exit_code == 2
    assert "already exists" in again.output
    assert load_catalog(home) != example_catalog()
    forced = _invoke(home, "init", "--force")
    assert forced.exit_code == 0, forced.output
    assert load_catalog(home) == example_catalog()


def test_r_cat_2_show_never_prints_credentials(tmp_path: Path) -> None:
    home = tmp_path / "state"
    assert _invoke(home, "init").exit_code == 0
    env = {"OPENAI_API_KEY": SECRET, "ANTHROPIC_API_KEY": ""}
    text = _invoke(home, "show", env=env)
    assert text.exit_code == 0, text.output
    assert SECRET not in text.output
    assert (
        "openai  api=openai-chat  baseUrl=https://api.openai.com/v1  available=yes" in text.stdout
    )
    assert (
        "anthropic  api=anthropic-messages  baseUrl=https://api.anthropic.com  available=no"
        in text.stdout
    )
    assert "local  api=openai-chat  baseUrl=http://127.0.0.1:8080/v1  available=yes" in text.stdout
    assert (
        "anthropic/claude-sonnet-4-5  window=1000000  max_output=64000"
        "  price=3/15 <=200000; 6/22.5  reasoning=yes"
    ) in text.stdout
    assert "local/llama-3.1-8b  window=131072  max_output=8192  price=unknown" in text.stdout
    as_json = _invoke(home, "show", "--json", env=env)
    assert as_json.exit_code == 0, as_json.output
    assert SECRET not in as_json.output
    shown = json.loads(as_json.stdout)
    assert {p["name"]: p["available"] for p in shown["providers"]} == {
        "openai": True, "anthropic": False, "local": True
    }
    mini = next(m for m in shown["models"] if m["key"] == "openai/gpt-4.1-mini")
    assert mini == {"key": "openai/gpt-4.1-mini", "contextWindow": 1047576,
                    "maxOutputTokens": 32768, "reasoning": False,
                    "pricing": [{"inputUsdPerMTok": 0.4, "outputUsdPerMTok": 1.6,
                                 "cacheReadUsdPerMTok": 0.1}]}


def test_r_cat_1_show_without_catalog(tmp_path: Path) -> None:
    result = _invoke(tmp_path / "state", "show")
    assert result.exit_code == 0
    assert "no catalog.json" in result.stdout
    as_json = _invoke(tmp_path / "state", "show", "--json")
    assert json.loads(as_json.stdout) == {"providers": [], "models": []}
    assert not (tmp_path / "state").exists()
