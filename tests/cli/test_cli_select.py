"""Issue 13 item 6: `ledger select` on a large catalog prints routes and a per-reason summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from ledger.cli.main import cli

N_OFFLINE = 500

CATALOG: dict[str, Any] = {
    "providers": {
        "local": {"available": True, "baseUrl": "http://127.0.0.1:9/v1"},
        "offline": {"credentialEnv": "OFFLINE_TEST_KEY", "baseUrl": "http://127.0.0.1:9/v1"},
        "vision": {"available": True, "baseUrl": "http://127.0.0.1:9/v1"},
    },
    "models": [
        {"provider": "local", "id": "a",
         "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}]},
        {"provider": "local", "id": "b"},
        {"provider": "vision", "id": "img", "input": ["image"]},
        *({"provider": "offline", "id": f"m{i:04d}"} for i in range(N_OFFLINE)),
    ],
}  # fmt: skip


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), "select", *args], env={})


def big_home(tmp_path: Path) -> Path:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(CATALOG))
    upgraded = CliRunner().invoke(cli, ["--home", str(home), "db", "upgrade"], env={})
    assert upgraded.exit_code == 0, upgraded.output  # reads never create a ledger (issue 15)
    return home


def test_issue13_item6_select_summarises_exclusions_by_reason(tmp_path: Path) -> None:
    home = big_home(tmp_path)
    result = invoke(home, "s1", "--model", "local/a")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) < 12, result.stdout
    # R-RT-1: the chain that matched comes first, then the routes
    assert lines[0].startswith("chain: none (no chain")
    assert lines[1:3] == ["routes (in order):", "  1. local/a"]
    assert f"excluded: {N_OFFLINE + 2} models (--all lists each)" in lines
    # the credential variable to set is named (issue 20 item 16), never its value
    assert f"  unavailable    {N_OFFLINE}  set OFFLINE_TEST_KEY" in lines
    assert "  no_text        1" in lines
    assert "  same_provider  1" in lines
    assert not any("offline/m0000" in line for line in lines)


def test_issue13_item6_named_model_keeps_its_own_reason_line(tmp_path: Path) -> None:
    home = big_home(tmp_path)
    result = invoke(home, "s1", "--model", "vision/img")
    assert "named models excluded:" in result.stdout
    assert "  vision/img  no_text" in result.stdout.splitlines()


def test_issue13_item6_all_lists_every_exclusion(tmp_path: Path) -> None:
    home = big_home(tmp_path)
    result = invoke(home, "s1", "--model", "local/a", "--all")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 4 + N_OFFLINE + 2  # the chain line (R-RT-1)
    assert "  offline/m0499  unavailable (set OFFLINE_TEST_KEY)" in result.stdout.splitlines()


def test_issue13_item6_json_keeps_the_full_list_and_adds_counts(tmp_path: Path) -> None:
    doc = json.loads(invoke(big_home(tmp_path), "s1", "--model", "local/a", "--json").stdout)
    assert len(doc["excluded"]) == N_OFFLINE + 2
    assert doc["excluded_by_reason"] == {"unavailable": N_OFFLINE, "no_text": 1, "same_provider": 1}


def test_issue33_unavailable_hint_names_every_missing_piece(tmp_path: Path) -> None:
    """After a LiteLLM import the `unavailable` hint said only "set VERTEX_…_API_KEY"; once set,
    the models were still excluded as `no_base_url`. The hint names the credential AND the
    missing baseUrl, in select, status and their JSON."""
    import json as json_module

    from click.testing import CliRunner

    from ledger.cli.main import cli as group

    home = tmp_path / "h"
    home.mkdir()
    (home / "catalog.json").write_text(json_module.dumps({
        "providers": {"vx": {"credentialEnv": "VX_API_KEY", "api": "openai-chat"},
                      "ok": {"available": True, "api": "openai-chat",
                             "baseUrl": "http://127.0.0.1:9/v1"}},
        "models": [{"provider": "vx", "id": "m1", "contextWindow": 8000},
                   {"provider": "ok", "id": "m2", "contextWindow": 8000}],
    }))  # fmt: skip
    runner = CliRunner(env={"VX_API_KEY": None})

    def run(*args: str) -> str:
        result = runner.invoke(group, ["--home", str(home), *args])
        assert result.exit_code in (0, 3), result.output
        return result.output

    shown = run("select", "s1", "--all")
    assert "vx/m1  unavailable (set VX_API_KEY and a baseUrl)" in shown
    assert "1 also need a baseUrl in catalog.json" in run("select", "s1")
    doc = json_module.loads(run("status", "--json"))
    vx = next(e for e in doc["excluded"] if e["model"] == "vx/m1")
    assert (vx["credential_env"], vx["base_url_missing"]) == ("VX_API_KEY", True)
    assert "unavailable (set VX_API_KEY and a baseUrl)" in run("status")
