"""Issue 15 item 7: a typo in recovery.json or catalog.json can be found — an unknown key is shown
when it is a plausible identifier, with the nearest known key; invalid JSON is placed by line and
column; a misspelt command gets the nearest one. Never a value, never a long or odd key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.catalog import parse_catalog
from ledger.cli.main import cli
from ledger.config import parse_policy
from ledger.errors import ConfigError

LONG = "A" * 33


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"callsPerHr": 3}, "callsPerHr: unknown key (not allowed); did you mean `callsPerHour`?"),
        ({"fallbackModel": []},
         "fallbackModel: unknown key (not allowed); did you mean `fallbackModels`?"),
        ({"routes": {"alow": []}},
         "routes.alow: unknown key (not allowed); did you mean `allow`?"),
        ({"routes": {"deny": [], "zzz": []}}, "routes.zzz: unknown key (not allowed)"),
        ({"sk_live_0123456789abcdef0123456789": 1},  # 34 characters: not shown
         "<key>: unknown key (not allowed)"),
        ({LONG: 1}, "<key>: unknown key (not allowed)"),
        ({"sk-live-123": 1}, "<key>: unknown key (not allowed)"),
        # credentials pasted as a key, 32 characters or fewer, [A-Za-z0-9_] (review of item 7)
        ({"sk_live_0123456789abcdef01234567": 1}, "<key>: unknown key (not allowed)"),
        ({"AKIAIOSFODNN7EXAMPLE": 1}, "<key>: unknown key (not allowed)"),
        ({"0123456789abcdef0123456789abcdef": 1}, "<key>: unknown key (not allowed)"),
        ({"ghp_R8xKq2LmZ0aB": 1}, "<key>: unknown key (not allowed)"),
        ({"max_calls": 1}, "max_calls: unknown key (not allowed)"),
        ({"callsPerHour ": 1}, "<key>: unknown key (not allowed); did you mean `callsPerHour`?"),
    ],
)
def test_issue15_item7_unknown_policy_key_shown_only_when_plausible(
    doc: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(json.dumps(doc), "recovery.json")
    assert info.value.message == f"recovery.json: {message}"


def test_issue15_item7_unknown_catalog_key_suggests_the_field_of_its_level() -> None:
    doc = {"providers": {"acme": {"credentalEnv": "X"}}, "models": []}
    with pytest.raises(ConfigError) as info:
        parse_catalog(json.dumps(doc), "catalog.json")
    assert info.value.message == (
        "catalog.json: providers.<key>.credentalEnv: unknown key (not allowed); "
        "did you mean `credentialEnv`?"
    )
    model = {"provider": "a", "id": "b", "contextWindw": 5}
    with pytest.raises(ConfigError) as info:
        parse_catalog(json.dumps({"providers": {}, "models": [model]}), "catalog.json")
    assert info.value.path == "models[0].contextWindw"
    assert info.value.rule.endswith("did you mean `contextWindow`?")


@pytest.mark.parametrize(
    ("text", "where", "why"),
    [
        ('{\n  "callsPerHour": 3,\n}\n', "line 3, column 1",
         "expecting property name enclosed in double quotes"),
        ('{"callsPerHour": 3 "sourceCalls": 2}', "line 1, column 20", "expecting ',' delimiter"),
        ('{"defaultModel": "sk-live-SECRET\n"}', "line 1, column 33", "invalid control character)"),
        ("", "line 1, column 1", "expecting value"),
    ],
)
def test_issue15_item7_invalid_json_gives_line_and_column(
    tmp_path: Path, text: str, where: str, why: str
) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "recovery.json").write_text(text)
    result = CliRunner().invoke(cli, ["--home", str(home), "config", "validate"])
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"ledger: {home / 'recovery.json'}: {where}: is not valid JSON (")
    assert why in lines[0]
    assert "SECRET" not in result.output


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("stauts", "status"), ("catlog", "catalog"), ("soruce", "source"), ("wroker", "worker")],
)
def test_issue15_item7_misspelt_command_suggests_the_nearest(
    tmp_path: Path, typed: str, meant: str
) -> None:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path / "h"), typed])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f"ledger: No such command '{typed}'. Did you mean '{meant}'?"
    ]
    unrelated = CliRunner().invoke(cli, ["--home", str(tmp_path / "h"), "qqqqqq"])
    assert unrelated.output.splitlines() == ["ledger: No such command 'qqqqqq'."]
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize(
    ("typed", "line"),
    [
        ("sk_live_51HxQz8Abc", "ledger: No such command."),
        ("sk-proj-ABCdef0123456789", "ledger: No such command."),
        ("Status", "ledger: No such command. Did you mean 'status'?"),
        ("a" * 33, "ledger: No such command."),
        ("x" * 32, f"ledger: No such command '{'x' * 32}'."),
        ("stat-us2", "ledger: No such command 'stat-us2'. Did you mean 'status'?"),
    ],
)
def test_r_diag_3_an_unknown_command_that_is_not_a_command_word_is_not_echoed(
    tmp_path: Path, typed: str, line: str
) -> None:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path / "h"), typed, "--json"])
    assert result.exit_code == 2
    assert result.output.splitlines() == [line]
    assert not (tmp_path / "h").exists()
