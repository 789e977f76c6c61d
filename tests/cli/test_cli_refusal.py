"""Issue 20 item 14: a refusal says when to retry (`retry_at`), as text and as JSON (SPEC 13)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result
from freezegun import freeze_time

from ledger.cli.main import cli
from tests.support.ledgers import write_policy


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def test_issue20_item14_hourly_refusal_says_when_to_retry(home: Path) -> None:
    write_policy(home, callsPerHour=1)
    with freeze_time("2027-01-15T08:00:00Z") as frozen:
        assert invoke(home, "reserve", "s1", "--model", "alpha/small").exit_code == 0
        frozen.tick(60 * 60 - 90)  # 58m30s later: the slot frees at 09:00:00
        refused = invoke(home, "reserve", "s2", "--model", "alpha/small", "--json")
        text = invoke(home, "reserve", "s2", "--model", "alpha/small")
    assert refused.exit_code == 3
    error = json.loads(refused.output)["error"]
    assert error["code"] == "shared_hourly_budget"
    assert error["retry_at"] == "2027-01-15T09:00:00.000Z"
    assert text.exit_code == 3
    assert text.output.strip().count("\n") == 0  # one line
    assert "shared_hourly_budget" in text.output
    assert "retry at 2027-01-15T09:00:00.000Z (in 1m30s)" in text.output


def test_issue20_item14_cooldown_refusal_says_when_it_ends(home: Path) -> None:
    with freeze_time("2027-01-15T08:00:00Z"):
        assert invoke(home, "cooldown", "set", "alpha", "2h").exit_code == 0
        refused = invoke(home, "reserve", "s1", "--model", "alpha/small", "--json")
        text = invoke(home, "reserve", "s1", "--model", "alpha/small")
    assert json.loads(refused.output)["error"]["retry_at"] == "2027-01-15T10:00:00.000Z"
    assert "provider_cooldown" in text.output
    assert "retry at 2027-01-15T10:00:00.000Z (in 2h)" in text.output


def test_issue20_item14_untimed_refusal_says_waiting_does_not_help(home: Path) -> None:
    write_policy(home, sourceCalls=1)
    assert invoke(home, "reserve", "s1", "--model", "alpha/small").exit_code == 0
    refused = invoke(home, "reserve", "s1", "--model", "alpha/small", "--json")
    text = invoke(home, "reserve", "s1", "--model", "alpha/small")
    assert json.loads(refused.output)["error"] == {
        "code": "source_calls",
        "message": "refused: source_calls",
        "retry_at": None,
        "hint": json.loads(refused.output)["error"]["hint"],
    }
    assert "retry at" not in text.output
    assert "waiting does not help" in text.output
    assert "ledger source evolve" in text.output
    assert text.output.strip().count("\n") == 0
