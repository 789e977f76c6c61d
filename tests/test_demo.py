"""SPEC section 14: `ledger demo` runs the real worker over real HTTP against the local stand-in
and ends with a status that shows fallback, cooldowns, a paused source and budgets kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli.main import _register, cli
from ledger.demo import DEMO_POLICY, run_demo


@pytest.fixture(scope="module")
def demo_doc() -> dict[str, Any]:
    """One in-process demo run (throw-away state directory), as its JSON document."""
    return run_demo().to_json()


def test_spec_14_demo_is_fast_and_uses_real_http(demo_doc: dict[str, Any]) -> None:
    assert demo_doc["wall_ms"] < 30_000
    assert demo_doc["home"] is None
    assert demo_doc["http_requests"] == demo_doc["facts"]["attempts"] >= 12
    assert demo_doc["worker"]["exit_code"] == 0


def test_spec_14_demo_shows_fallback_cooldown_pause_within_budgets(
    demo_doc: dict[str, Any],
) -> None:
    facts, status = demo_doc["facts"], demo_doc["status"]
    assert facts["cross_provider_fallbacks"] >= 1
    assert facts["corrections"] >= 1
    assert status["sources"]["counts"]["paused"] >= 1
    assert status["sources"]["counts"]["done"] >= 1
    paused = [s for s in status["sources"]["list"] if s["state"] == "paused"]
    assert paused[0]["pause_reason"] == "output_failures"
    assert len(status["cooldowns"]) >= 1
    assert {c["kind"] for c in status["cooldowns"]} >= {"auth", "rate_limit", "transport",
                                                          "request_rejected"}
    assert status["hourly"]["used"] <= status["hourly"]["limit"] == DEMO_POLICY["callsPerHour"]
    assert status["daily"]["spent_usd"] <= status["daily"]["ceiling_usd"]
    assert facts["hourly_used"] <= facts["hourly_limit"]
    assert facts["daily_spent_usd"] <= facts["daily_ceiling_usd"]


def test_spec_14_cli_demo_honours_global_home_and_exits_0(tmp_path: Path) -> None:
    _register()
    home = tmp_path / "demo-home"
    result = CliRunner().invoke(cli, ["--home", str(home), "demo", "--json", "--sources", "4"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["home"] == str(home)
    assert (home / "ledger.db").is_file()
    assert (home / "catalog.json").is_file()
    assert doc["status"]["sources"]["counts"]["done"] >= 1
    again = CliRunner().invoke(cli, ["demo", "--home", str(home)])
    assert again.exit_code == 2  # a used state directory is never overwritten


def test_spec_14_cli_demo_text_ends_with_status(tmp_path: Path) -> None:
    _register()
    result = CliRunner().invoke(cli, ["demo", "--home", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("[worker] 13 items")
    assert "$ ledger status" in result.output
