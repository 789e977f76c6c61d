"""Issue 20 item 15 (R-POL-8, R-POL-2, R-DIAG-1): `cooldown set` and `clear` report the cooldown in
force and what still refuses, `--reason` is shown, durations read as an operator reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from freezegun import freeze_time

from ledger.cli.main import cli

T0 = "2027-01-15T08:00:00Z"


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def doc(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _auth_failure_on_alpha(home: Path) -> None:
    """A 401 on alpha/small: a 15 min policy cooldown on provider alpha (until 08:15:00)."""
    rid = doc(invoke(home, "reserve", "s1", "--model", "alpha/small", "--json"))["id"]
    assert invoke(home, "settle", str(rid), "--http-status", "401").exit_code == 0


def test_issue20_item15_set_reports_the_longer_policy_cooldown_in_force(home: Path) -> None:
    with freeze_time(T0):
        _auth_failure_on_alpha(home)
        out = doc(invoke(home, "cooldown", "set", "alpha", "5m", "--reason", "maint", "--json"))
        text = invoke(home, "cooldown", "set", "alpha", "5m").output
    assert out["until"] == "2027-01-15T08:15:00.000Z"  # in force: the policy one, not the 5 min
    assert out["origin"] == "policy"
    assert out["kind"] == "auth"
    assert out["manual"] == {
        "until": "2027-01-15T08:05:00.000Z",
        "remaining_s": 300.0,
        "reason": "maint",
    }
    assert [(c["origin"], c["until"]) for c in out["cooldowns"]] == [
        ("policy", "2027-01-15T08:15:00.000Z"),
        ("manual", "2027-01-15T08:05:00.000Z"),
    ]
    assert "until 2027-01-15T08:15:00.000Z (15m)" in text
    assert "auth (policy)" in text
    assert "ledger cooldown clear alpha --force" in text


def test_issue20_item15_model_cooldown_blocked_by_its_provider(home: Path) -> None:
    with freeze_time(T0):
        _auth_failure_on_alpha(home)
        out = doc(invoke(home, "cooldown", "set", "alpha/small", "1m", "--json"))
    assert (out["scope"], out["target"]) == ("model", "alpha/small")
    assert out["until"] == "2027-01-15T08:15:00.000Z"
    assert out["cooldowns"][0]["scope"] == "provider"


def test_issue20_item15_clear_says_what_still_blocks(home: Path) -> None:
    with freeze_time(T0):
        _auth_failure_on_alpha(home)
        invoke(home, "cooldown", "set", "alpha", "5m")
        out = doc(invoke(home, "cooldown", "clear", "alpha", "--json"))
        invoke(home, "cooldown", "set", "alpha", "5m")
        text = invoke(home, "cooldown", "clear", "alpha").output
        forced = doc(invoke(home, "cooldown", "clear", "alpha", "--force", "--json"))
        gone = invoke(home, "cooldown", "clear", "alpha").output
    assert out["removed"] == 1
    assert out["until"] == "2027-01-15T08:15:00.000Z"
    assert [(c["origin"], c["kind"]) for c in out["cooldowns"]] == [("policy", "auth")]
    assert "removed 1" in text
    assert "still refused until 2027-01-15T08:15:00.000Z (15m)" in text
    assert "ledger cooldown clear alpha --force" in text
    assert (forced["removed"], forced["until"], forced["cooldowns"]) == (1, None, [])
    assert "is not cooling; nothing to clear" in gone  # issue 33: nothing was removed


def test_issue20_item15_reason_is_shown_in_list_and_status(home: Path) -> None:
    with freeze_time(T0):
        invoke(home, "cooldown", "set", "beta", "2h", "--reason", "provider maintenance window")
        listed = doc(invoke(home, "cooldown", "list", "--json"))["cooldowns"]
        text = invoke(home, "cooldown", "list").output
        status = doc(invoke(home, "status", "--json"))["cooldowns"]
        dashboard = invoke(home, "status").output
    assert listed[0]["reason"] == "provider maintenance window"
    assert status[0]["reason"] == "provider maintenance window"
    assert "provider maintenance window" in text
    assert "provider maintenance window" in dashboard


def test_issue20_item15_a_new_reason_replaces_the_old_one(home: Path) -> None:
    with freeze_time(T0):
        invoke(home, "cooldown", "set", "beta", "2h", "--reason", "first")
        out = doc(invoke(home, "cooldown", "set", "beta", "1h", "--reason", "second", "--json"))
    assert out["manual"]["until"] == "2027-01-15T10:00:00.000Z"  # never shortened (R-POL-2)
    assert out["manual"]["reason"] == "second"


def test_issue20_item15_durations_at_human_resolution(home: Path) -> None:
    with freeze_time(T0) as frozen:
        invoke(home, "cooldown", "set", "alpha", "2h")
        frozen.tick(0.612)
        outputs = [
            invoke(home, "cooldown", "list").output,
            invoke(home, "cooldown", "set", "alpha/small", "1h").output,
            invoke(home, "status").output,
        ]
    for output in outputs:
        assert "1h59m" in output
        assert not re.search(r"\d+s\d+ms|\dh\d+m\d+s", output), output


def test_issue33_clear_on_a_target_that_never_cooled_says_so(home: Path) -> None:
    """`cooldown clear` on a target that was never cooling said "no longer cooling"."""
    result = invoke(home, "cooldown", "clear", "alpha")
    assert result.exit_code == 0, result.output
    assert result.output == "provider alpha is not cooling; nothing to clear\n"
    assert "no longer" not in result.output
    assert invoke(home, "cooldown", "set", "alpha", "1h").exit_code == 0
    cleared = invoke(home, "cooldown", "clear", "alpha")
    assert "removed 1 manual cooldown(s) on provider alpha" in cleared.output
    assert "provider alpha is no longer cooling" in cleared.output  # true now
