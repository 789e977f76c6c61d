"""Policy file rules R-CFG-1..5: defaults, fail-closed validation, never echoing a value."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.config import Policy, parse_policy, policy_schema
from ledger.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-live-S3CR3T-do-not-print-0123456789"


def test_r_cfg_1_defaults_match_spec() -> None:
    spec = {
        "crossProviderFallback": True,
        "fallbackModels": [],
        "callsPerHour": 20,
        "sourceCalls": 4,
        "sourceModels": 2,
        "timeoutMs": 120000,
        "sourceTimeMs": 300000,
        "dailyEstimatedUsd": None,
    }
    doc = Policy().to_json()
    assert {k: doc[k] for k in spec} == spec
    assert doc["replyTokens"] == 4096


def test_r_cfg_1_example_file_lists_every_key_with_its_default() -> None:
    example = json.loads((ROOT / "recovery.example.json").read_text())
    assert example == Policy().to_json()
    assert parse_policy(json.dumps(example)) == Policy()


def test_r_cfg_5_example_validates_against_the_printed_schema() -> None:
    result = CliRunner().invoke(cli, ["config", "schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    example = json.loads((ROOT / "recovery.example.json").read_text())
    jsonschema.validate(example, schema)
    assert schema == policy_schema()
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"callsPerHour": 0}, schema)


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("R-CFG-2 unknown key", {"callsPerHourr": 3}, "callsPerHourr", "unknown key"),
    ("R-CFG-2 unknown key, not an identifier", {"calls-per-hour": 3}, "<key>", "unknown key"),
    ("R-CFG-2 wrong type", {"callsPerHour": "20"}, "callsPerHour", "must be an integer"),
    ("R-CFG-2 bool is not int", {"sourceCalls": True}, "sourceCalls", "must be an integer"),
    ("R-CFG-2 float is not int", {"timeoutMs": 1.5}, "timeoutMs", "must be an integer"),
    ("R-CFG-2 zero limit", {"callsPerHour": 0}, "callsPerHour", "greater than zero"),
    ("R-CFG-2 negative limit", {"sourceTimeMs": -1}, "sourceTimeMs", "greater than zero"),
    (
        "R-CFG-2 fallback malformed",
        {"fallbackModels": ["no-slash"]},
        "fallbackModels[0]",
        "wrong format",
    ),
    (
        "R-CFG-2 fallback empty id",
        {"fallbackModels": ["openai/"]},
        "fallbackModels[0]",
        "wrong format",
    ),
    (
        "R-CFG-2 fallback duplicate",
        {"fallbackModels": ["a/b", "a/b"]},
        "fallbackModels",
        "duplicate",
    ),
    ("R-CFG-2 ceiling zero", {"dailyEstimatedUsd": 0}, "dailyEstimatedUsd", ""),
    ("R-CFG-2 ceiling negative", {"dailyEstimatedUsd": -5}, "dailyEstimatedUsd", ""),
    ("R-CFG-2 ceiling string", {"dailyEstimatedUsd": "5"}, "dailyEstimatedUsd", ""),
    (
        "R-CFG-2 fallback flag type",
        {"crossProviderFallback": "yes"},
        "crossProviderFallback",
        "true or false",
    ),
    ("R-CFG-2 route rule type", {"routes": {"allow": [3]}}, "routes.allow[0]", "string"),
    ("R-CFG-2 route unknown key", {"routes": {"block": []}}, "routes.block", "unknown key"),
]


@pytest.mark.parametrize(("label", "doc", "path", "rule"), BAD, ids=[b[0] for b in BAD])
def test_r_cfg_2_fails_closed(label: str, doc: dict[str, Any], path: str, rule: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(json.dumps(doc), "recovery.json")
    assert info.value.path == path
    assert rule in info.value.rule
    assert info.value.message.startswith("recovery.json: ")


@pytest.mark.parametrize(
    "doc",
    [
        {"callsPerHour": SECRET},
        {SECRET: 1},
        {"fallbackModels": [SECRET]},
        {"defaultModel": SECRET + " x"},
        {"routes": {SECRET: []}},
        {"dailyEstimatedUsd": SECRET},
    ],
)
def test_r_cfg_3_error_never_echoes_the_value(doc: dict[str, Any], tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "recovery.json").write_text(json.dumps(doc))
    result = CliRunner().invoke(cli, ["--home", str(home), "config", "validate"])
    assert result.exit_code == 2
    assert SECRET not in result.output
    assert "S3CR3T" not in (result.stderr or "")
    assert len(result.output.strip().splitlines()) == 1
    assert re.match(r"^ledger: .*recovery\.json: ", result.output)
    assert not (home / "ledger.db").exists()  # fail closed: nothing that would reserve ran


def test_r_cfg_2_invalid_policy_blocks_reserving(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "recovery.json").write_text('{"callsPerHour": 0}')
    result = CliRunner().invoke(cli, ["--home", str(home), "reserve", "s1", "--model", "a/b"])
    assert result.exit_code == 2
    assert not (home / "ledger.db").exists()


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '"x"', "{" * 5000 + "}" * 5000])
def test_r_cfg_2_not_json_or_not_object(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_policy(text)


def test_r_cfg_4_validate_reports_ok(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "config", "validate", "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert doc["valid"] is True
    assert doc["policy_fingerprint"] == Policy().fingerprint()


def test_r_home_3_fingerprint_changes_with_policy() -> None:
    assert Policy().fingerprint() != Policy.model_validate({"callsPerHour": 21}).fingerprint()
    assert Policy().fingerprint() == Policy.model_validate({"callsPerHour": 20}).fingerprint()


def test_r_cfg_4_inert_entries_are_warned_by_position(home: Path) -> None:
    (home / "recovery.json").write_text(
        json.dumps(
            {
                "fallbackModels": ["beta/mid", "alpha/smal", "gamma/g1"],
                "routes": {"allow": ["alpha/*", "beta/*"], "deny": ["nobody/*"]},
            }
        )
    )
    result = CliRunner().invoke(cli, ["--home", str(home), "config", "validate", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [(e["field"], e["reason"]) for e in doc["inert"]] == [
        ("fallbackModels[1]", "not_in_catalog"),
        ("fallbackModels[2]", "provider_unavailable"),  # gamma's credential is unset
        ("routes.deny[0]", "matches_nothing"),
    ]
    assert doc["warnings"] == [e["message"] for e in doc["inert"]]
    assert doc["warnings"][0] == (
        "fallbackModels[1]: not_in_catalog (no catalog model has this id); inert"
    )
    text = CliRunner().invoke(cli, ["--home", str(home), "config", "validate"])
    assert text.exit_code == 0
    assert "warning: fallbackModels[1]" in text.output
    assert "alpha/smal" not in text.output  # the entry is named by position, never echoed


@pytest.mark.parametrize("lease_ms", [10, 40, 999])
def test_issue20_item2_a_lease_shorter_than_the_heartbeat_can_keep_fails_closed(
    lease_ms: int, tmp_path: Path
) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "recovery.json").write_text(json.dumps({"leaseMs": lease_ms}))
    result = CliRunner().invoke(cli, ["--home", str(home), "config", "validate"])
    assert result.exit_code == 2
    assert result.output.strip().endswith("recovery.json: leaseMs: must be at least 1000")
    assert len(result.output.strip().splitlines()) == 1
    assert not (home / "ledger.db").exists()


def test_issue20_item2_the_schema_states_the_lease_floor() -> None:
    schema = policy_schema()
    assert schema["properties"]["leaseMs"]["minimum"] == 1000
    jsonschema.validate({"leaseMs": 1000}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"leaseMs": 999}, schema)
    assert parse_policy('{"leaseMs": 1000}').lease_ms == 1000
