"""Issue 13 item 5: the LiteLLM map's `alias_of` entries, conflicting duplicates, --providers.

`data/litellm_issue13.json` holds 20 real entries of the litellm 1.110.2 wheel's
model_prices_and_context_window_backup.json, in file order: three aliases with their targets,
the `gemini-exp-1206` pair ($0 first, the real price last), the identical `deepseek-chat` pair,
chat models of providers with and without a known base URL, an embedding and `sample_spec`.
`scripts/litellm_full_map.py` runs the whole map (4,878 entries) the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.catalog import CATALOG_FILE, Model
from ledger.cli.main import cli
from ledger.errors import UsageError
from ledger.litellm import convert, parse_litellm

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "litellm_issue13.json"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return dict(parse_litellm(FIXTURE.read_bytes()))


def prices(model: Model | None) -> list[tuple[float | None, float | None]]:
    assert model is not None
    return [(t.input_usd_per_mtok, t.output_usd_per_mtok) for t in model.pricing or []]


def _chat(provider: str = "p", **fields: Any) -> dict[str, Any]:
    return {"litellm_provider": provider, "mode": "chat", **fields}


def test_issue13_item5_alias_of_imports_the_target_data(document: dict[str, Any]) -> None:
    result = convert(document)
    assert result.aliases == 3
    catalog = result.catalog
    assert prices(catalog.model("azure_ai/claude-fable-latest")) == [(10.0, 50.0)]
    assert prices(catalog.model("azure/gpt-mini-latest")) == [(0.75, 4.5)]
    alias = catalog.model("bedrock_converse/bedrock/claude-fable-latest")
    target = catalog.model("bedrock_converse/global.anthropic.claude-fable-5-1")
    assert alias is not None
    assert target is not None
    assert alias.model_copy(update={"id": target.id}) == target
    assert result.imported + result.skipped == len(document)


def test_issue13_item5_duplicate_keeps_the_priced_entry(document: dict[str, Any]) -> None:
    result = convert(document)
    assert prices(result.catalog.model("gemini/gemini-exp-1206")) == [(0.3, 2.5)]
    assert result.conflicting_duplicates == ("gemini/gemini-exp-1206",)  # deepseek: same data
    assert result.skipped_by_reason["duplicate"] == 2


def test_issue13_item5_duplicate_prefers_complete_then_first() -> None:
    sized = _chat(input_cost_per_token=1e-6, output_cost_per_token=2e-6, max_input_tokens=1000)
    bare = _chat(input_cost_per_token=1e-6, output_cost_per_token=2e-6)
    unpriced = _chat(max_input_tokens=9000, max_output_tokens=100)
    for first_entry, second_entry, window in [
        (unpriced, bare, None),  # priced beats sizes
        (bare, sized, 1000),  # then the more complete
        (sized, bare, 1000),
    ]:
        model = convert({"p/m": first_entry, "m": second_entry}).catalog.model("p/m")
        assert model is not None
        assert model.price_known()
        assert model.context_window == window
    cheap = _chat(input_cost_per_token=1e-6, output_cost_per_token=1e-6)
    dear = _chat(input_cost_per_token=5e-6, output_cost_per_token=5e-6)
    first = convert({"p/m": cheap, "m": dear})
    assert prices(first.catalog.model("p/m")) == [(1.0, 1.0)]
    assert first.conflicting_duplicates == ("p/m",)


@pytest.mark.parametrize(
    "entries",
    [
        {"a": {"alias_of": "missing"}},
        {"a": {"alias_of": 7}},
        {"a": {"alias_of": "b"}, "b": {"alias_of": "a"}},
        {"a": {"alias_of": "b"}, "b": "not an object"},
    ],
)
def test_issue13_item5_broken_alias_is_skipped(entries: dict[str, Any]) -> None:
    result = convert(entries)
    assert result.imported == 0
    assert result.skipped_by_reason.get("bad_alias", 0) >= 1
    assert result.imported + result.skipped == len(entries)


def test_issue13_item5_alias_chain_and_own_fields() -> None:
    document = {
        "p/base": _chat(input_cost_per_token=1e-6, output_cost_per_token=2e-6),
        "p/mid": {"alias_of": "p/base", "max_input_tokens": 4096},
        "p/latest": {"alias_of": "p/mid"},
    }
    catalog = convert(document).catalog
    latest = catalog.model("p/latest")
    assert latest is not None
    assert latest.context_window == 4096
    assert prices(latest) == [(1.0, 2.0)]


def test_issue13_item5_providers_matching_nothing_is_an_error(
    document: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match="match no chat model"):
        convert(document, frozenset({"nosuchprovider"}))
    with pytest.raises(UsageError):
        convert(document, frozenset({"gemini", "nosuchprovider"}))
    assert convert(document, frozenset({"gemini"})).imported == 1
    home = tmp_path / "state"
    result = CliRunner().invoke(
        cli,
        ["--home", str(home), "catalog", "import-litellm", str(FIXTURE), "--providers",
         "nope,sk-live-4f9a8b7c6d5e"],
    )
    assert result.exit_code == 2
    assert "`nope`" in result.output  # a provider-like name is named (issue 20 item 16)
    assert "4f9a8b7c6d5e" not in result.output  # a pasted credential never is
    assert not (home / CATALOG_FILE).exists()


def test_issue13_item5_cli_warns_about_conflicting_duplicates(tmp_path: Path) -> None:
    args = ["--home", str(tmp_path / "s"), "catalog", "import-litellm", str(FIXTURE)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "imported 16 chat models (3 aliases followed)" in result.stdout
    assert (
        "warning: gemini/gemini-exp-1206: entries with different data;"
        " kept the priced/most complete" in result.stdout
    )
    doc = json.loads(CliRunner().invoke(cli, [*args, "--dry-run", "--json"]).stdout)
    assert doc["aliases"] == 3
    assert doc["conflictingDuplicates"] == ["gemini/gemini-exp-1206"]


def test_issue13_item5_full_map_script_reads_a_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "litellm-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(FIXTURE, "litellm/model_prices_and_context_window_backup.json")
    script = ROOT / "scripts" / "litellm_full_map.py"
    out = subprocess.run(
        [sys.executable, str(script), str(wheel), "--json"],
        capture_output=True,
        check=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    report = json.loads(out.stdout)
    assert report["entries"] == 20
    assert report["aliasEntries"] == report["aliasesFollowed"] == 3
    assert report["imported"] == 16
    assert report["conflictingDuplicates"] == ["gemini/gemini-exp-1206"]
    assert report["providersWithoutBaseUrl"] == 3  # azure, azure_ai, bedrock_converse
