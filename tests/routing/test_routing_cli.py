"""`ledger pool list|show|cycle`, pools in status (text, JSON, Prometheus) and inert routing
entries in `config validate` (R-RT-7), through the CLI on a real ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ledger.cli.main import cli
from tests.support.routing_fixtures import MEMBERS, routing_catalog

POOLS = {
    "p": {"candidates": MEMBERS, "strategy": "round-robin", "sticky": "on"},
    "dead": {"candidates": ["nobody/x"]},
}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    (path / "catalog.json").write_text(json.dumps(routing_catalog()))
    policy = {"pools": POOLS, "sourceModels": 10, "callsPerHour": 100,
              "chains": {"acct1/*": ["pool/p", "nobody/y"], "zzz/*": ["acct2/m"]}}  # fmt: skip
    (path / "recovery.json").write_text(json.dumps(policy))
    return path


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_r_rt_7_pool_show_has_strategy_cursor_candidates_and_leases(home: Path) -> None:
    first = as_json(invoke(home, "reserve", "s1", "--model", "pool/p", "--json"))
    invoke(home, "settle", str(first["id"]), "--ok", "--input-tokens", "1", "--output-tokens", "1")
    invoke(home, "cooldown", "set", "acct3/m", "1h")
    doc = as_json(invoke(home, "pool", "show", "p", "--json"))
    assert doc["strategy"] == "round-robin"
    assert doc["cursor"] == 0
    assert [(c["model"], c["state"]) for c in doc["candidates"]] == [
        ("acct1/m", "eligible"), ("acct2/m", "eligible"),
        ("acct3/m", "model_cooldown"), ("acct4/m", "eligible"),
    ]  # fmt: skip
    assert doc["leases"] == [{"scope": "s1", "model": "acct1/m", "until": None}]
    text = invoke(home, "pool", "show", "p")
    assert "pool p: round-robin, sticky on (source), cursor 0" in text.output
    assert "acct3/m  model_cooldown until" in text.output
    assert "sticky: source s1 -> acct1/m (until it fails or cools)" in text.output
    listed = as_json(invoke(home, "pool", "list", "--json"))
    assert [p["pool"] for p in listed["pools"]] == ["p", "dead"]
    missing = invoke(home, "pool", "show", "sk-secret-name")
    assert missing.exit_code == 2
    assert "sk-secret" not in missing.output


def test_r_rt_7_pool_cycle_cools_the_current_pick_and_moves_on(home: Path) -> None:
    as_json(invoke(home, "reserve", "s1", "--model", "pool/p", "--json"))  # cursor on acct1
    cycled = as_json(invoke(home, "pool", "cycle", "p", "10m", "--json"))
    assert cycled["cooled"] == "acct1/m"
    cooldowns = as_json(invoke(home, "cooldown", "list", "--json"))["cooldowns"]
    assert [(c["target"], c["origin"]) for c in cooldowns] == [("acct1/m", "manual")]
    picks = [as_json(invoke(home, "reserve", f"s{i}", "--model", "pool/p", "--json"))["model"]
             for i in range(2, 6)]  # fmt: skip
    assert picks == ["acct2/m", "acct3/m", "acct4/m", "acct2/m"]


def test_r_rt_7_status_shows_pools_in_text_json_and_prometheus(home: Path) -> None:
    as_json(invoke(home, "reserve", "s1", "--model", "pool/p", "--json"))
    doc = as_json(invoke(home, "status", "--json"))
    assert [p["pool"] for p in doc["pools"]] == ["p", "dead"]
    assert doc["pools"][0]["cursor"] == 0
    text = invoke(home, "status").output
    assert "── pools" in text
    assert "p  round-robin, sticky on, cursor 0" in text
    prom = invoke(home, "status", "--prometheus").output
    assert 'ledger_pool_cursor{pool="p",strategy="round-robin"} 0' in prom
    assert 'ledger_pool_candidate_eligible{pool="p",model="acct2/m",state="eligible"} 1' in prom


def test_r_rt_7_config_validate_reports_inert_chains_pools_and_entries(home: Path) -> None:
    doc = as_json(invoke(home, "config", "validate", "--json"))
    fields = {(e["field"], e["reason"]) for e in doc["inert"]}
    assert ("chains.<key 1>[1]", "unknown_provider") in fields  # nobody/y
    assert ("chains.<key 2>", "matches_nothing") in fields  # zzz/*
    assert ("pools.<key 2>.candidates[0]", "unknown_provider") in fields
    assert not any(f.startswith("chains.<key 1>[0]") for f, _ in fields)  # pool/p is usable
    assert all("nobody" not in w and "zzz" not in w for w in doc["warnings"])
