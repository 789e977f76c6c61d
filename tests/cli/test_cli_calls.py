"""SPEC section 13 for reserve, settle, select, cooldown and source: JSON shapes and exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ledger.cli.main import cli
from ledger.store import sqlite_driver


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def as_json(result: Result) -> Any:
    return json.loads(result.output)


def row_counts(home: Path) -> tuple[int, ...]:
    with sqlite_driver.connect(home / "ledger.db") as raw:
        return tuple(
            raw.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("sources", "reservations", "cooldowns", "notices")
        )


def test_reserve_json_shape_and_refusal_exit_3(home: Path) -> None:
    (home / "recovery.json").write_text('{"callsPerHour": 1}')
    ok = invoke(home, "reserve", "s1", "--model", "alpha/small", "--input-bytes", "300", "--json")
    assert ok.exit_code == 0, ok.output
    doc = as_json(ok)
    assert {"id", "source", "model", "deadline", "estimate_usd"} <= set(doc)
    assert doc["deadline"].endswith("Z")
    assert doc["estimate_usd"] == pytest.approx((300 * 1 + 4096 * 2) / 1e6)
    refused = invoke(home, "reserve", "s2", "--model", "alpha/small", "--json")
    assert refused.exit_code == 3
    assert as_json(refused)["error"]["code"] == "shared_hourly_budget"
    text = invoke(home, "reserve", "s2", "--model", "alpha/small")
    assert text.exit_code == 3
    assert "shared_hourly_budget" in text.output


def test_reserve_text_names_the_source_and_the_allowance(home: Path) -> None:
    # R-RES-8, R-HTTP-3: a CLI worker times its call by the allowance, not by its own wall clock
    (home / "recovery.json").write_text('{"timeoutMs": 2500}')
    ok = invoke(home, "reserve", "transcript-7", "--model", "alpha/small")
    assert ok.exit_code == 0, ok.output
    assert ": alpha/small for source transcript-7 until " in ok.output
    assert "(2.5 s allowed)" in ok.output


def test_reserve_request_id_replays(home: Path) -> None:
    first = as_json(
        invoke(home, "reserve", "s1", "--model", "beta/mid", "--request-id", "r1", "--json")
    )
    again = as_json(
        invoke(home, "reserve", "s1", "--model", "beta/mid", "--request-id", "r1", "--json")
    )
    assert again["id"] == first["id"]
    assert again["replayed"] is True


@pytest.mark.parametrize(
    "args",
    [
        ["reserve", "s1", "--model", "alpha/nope"],
        ["reserve", "s1", "--model", "nokey"],
        ["reserve", "s1", "--model", "alpha/small", "--input-bytes", "-5"],
        ["reserve", "s1", "--model", "alpha/small", "--input-bytes", "99999999999999999999"],
        ["reserve", "bad\x07id", "--model", "alpha/small"],
        ["reserve", "x" * 201, "--model", "alpha/small"],
        ["settle", "999", "--ok"],
        ["settle", "1"],
        ["settle", "1", "--ok", "--cancelled"],
        ["settle", "1", "--kind", "not_a_kind"],
        ["settle", "1", "--ok", "--cost-usd", "nan"],
        ["settle", "1", "--ok", "--input-tokens", "-1"],
        ["settle", "1", "--http-status", "999"],
        ["cooldown", "set", "alpha", "-5m"],
        ["cooldown", "set", "alpha", "forever"],
        ["cooldown", "set", "nobody", "5m"],
        ["cooldown", "set", "alpha/nope", "5m"],
        ["source", "pause", "unknown-source"],
        ["select", "s1", "--model", "alpha/nope"],
        ["select", "s1", "--after-failure", "auth"],
    ],
)
def test_bad_input_exit_2_one_line_nothing_written(home: Path, args: list[str]) -> None:
    setup = invoke(home, "reserve", "s0", "--model", "alpha/small")
    assert setup.exit_code == 0
    before = row_counts(home)
    result = invoke(home, *args)
    assert result.exit_code == 2, (args, result.output)
    assert len(result.output.strip().splitlines()) <= 3  # click usage errors add a usage hint
    assert "Traceback" not in result.output
    assert row_counts(home) == before


def test_settle_twice_is_bad_input(home: Path) -> None:
    rid = as_json(invoke(home, "reserve", "s1", "--model", "alpha/small", "--json"))["id"]
    assert invoke(home, "settle", str(rid), "--ok").exit_code == 0
    again = invoke(home, "settle", str(rid), "--ok")
    assert again.exit_code == 2
    assert "already settled" in again.output


def test_settle_from_http_facts_prints_kind_and_actions(home: Path) -> None:
    rid = as_json(invoke(home, "reserve", "s1", "--model", "alpha/small", "--json"))["id"]
    result = invoke(
        home, "settle", str(rid), "--http-status", "429", "--retry-after", "120", "--json"
    )
    assert result.exit_code == 0, result.output
    doc = as_json(result)
    assert doc["kind"] == "rate_limit"
    assert doc["fallback"] == {"constraint": "other_provider_or_sibling"}
    assert any("cooldown model alpha/small" in a for a in doc["actions"])
    listed = as_json(invoke(home, "cooldown", "list", "--json"))["cooldowns"]
    assert listed == [
        {
            **listed[0],
            "scope": "model",
            "target": "alpha/small",
            "kind": "rate_limit",
            "origin": "hint",
        }
    ]
    assert 119 <= listed[0]["remaining_s"] <= 120


def test_settle_quota_code_and_side_effects(home: Path) -> None:
    rid = as_json(invoke(home, "reserve", "s1", "--model", "alpha/small", "--json"))["id"]
    doc = as_json(
        invoke(
            home,
            "settle",
            str(rid),
            "--http-status",
            "429",
            "--code",
            "insufficient_quota",
            "--side-effects",
            "--json",
        )
    )
    assert doc["kind"] == "quota"
    assert doc["fallback"] is None


def test_settle_ok_finish_then_source_settled(home: Path) -> None:
    rid = as_json(invoke(home, "reserve", "s1", "--model", "alpha/small", "--json"))["id"]
    doc = as_json(
        invoke(
            home,
            "settle",
            str(rid),
            "--ok",
            "--input-tokens",
            "100",
            "--output-tokens",
            "50",
            "--finish",
            "--json",
        )
    )
    assert doc["finished"] is True
    assert doc["cost_usd"] == pytest.approx((100 * 1 + 50 * 2) / 1e6)
    again = invoke(home, "reserve", "s1", "--model", "alpha/small", "--json")
    assert again.exit_code == 3
    assert as_json(again)["error"]["code"] == "source_settled"


def test_cooldown_set_list_clear(home: Path) -> None:
    result = invoke(home, "cooldown", "set", "alpha", "1h30m", "--json")
    assert result.exit_code == 0, result.output
    assert as_json(result)["remaining_s"] == pytest.approx(5400, abs=1)
    assert invoke(home, "cooldown", "set", "beta/mid", "45s").exit_code == 0
    listed = as_json(invoke(home, "cooldown", "list", "--json"))["cooldowns"]
    assert [(c["scope"], c["target"], c["origin"]) for c in listed] == [
        ("model", "beta/mid", "manual"),
        ("provider", "alpha", "manual"),
    ]
    refused = invoke(home, "reserve", "s1", "--model", "alpha/big", "--json")
    assert as_json(refused)["error"]["code"] == "provider_cooldown"
    cleared = as_json(invoke(home, "cooldown", "clear", "alpha", "--json"))
    assert cleared["removed"] == 1
    assert invoke(home, "reserve", "s1", "--model", "alpha/big").exit_code == 0


def test_cooldown_clear_policy_needs_force(home: Path) -> None:
    rid = as_json(invoke(home, "reserve", "s1", "--model", "alpha/small", "--json"))["id"]
    invoke(home, "settle", str(rid), "--http-status", "401")
    assert as_json(invoke(home, "cooldown", "clear", "alpha", "--json"))["removed"] == 0
    assert as_json(invoke(home, "cooldown", "clear", "alpha", "--force", "--json"))["removed"] == 1


def test_select_json_and_exit_3_when_nothing_eligible(home: Path) -> None:
    assert invoke(home, "db", "upgrade").exit_code == 0  # select reads; it never creates one
    result = invoke(home, "select", "s1", "--model", "alpha/small", "--json")
    assert result.exit_code == 0, result.output
    doc = as_json(result)
    assert doc["routes"][0] == "alpha/small"
    assert {e["model"]: e["reason"] for e in doc["excluded"]}["gamma/g1"] == "unavailable"
    after = as_json(
        invoke(
            home,
            "select",
            "s1",
            "--model",
            "alpha/small",
            "--after-failure",
            "auth",
            "--failed-model",
            "alpha/small",
            "--json",
        )
    )
    assert all(not r.startswith("alpha/") for r in after["routes"])
    for target in ("alpha", "beta"):
        invoke(home, "cooldown", "set", target, "10m")
    none = invoke(home, "select", "s1", "--model", "alpha/small", "--json")
    assert none.exit_code == 3
    assert as_json(none)["routes"] == []
    assert as_json(none)["retry_at"] is not None
    assert (
        "alpha/small"
        not in invoke(home, "select", "s1", "--model", "alpha/small").output.split("excluded:")[0]
    )


def test_source_lifecycle(home: Path) -> None:
    assert invoke(home, "source", "add", "doc-1", "--payload", "s3://bucket/doc-1").exit_code == 0
    listed = as_json(invoke(home, "source", "list", "--json"))["sources"]
    assert listed[0]["id"] == "doc-1"
    assert listed[0]["in_worker_queue"] is True
    assert "queued" not in listed[0]  # issue 33: never `"state": "queued", "queued": false`
    assert as_json(invoke(home, "source", "pause", "doc-1", "--json"))["state"] == "paused"
    refused = invoke(home, "reserve", "doc-1", "--model", "alpha/small", "--json")
    assert as_json(refused)["error"]["code"] == "source_paused"
    assert as_json(invoke(home, "source", "resume", "doc-1", "--json"))["state"] == "queued"
    evolve = invoke(home, "source", "evolve", "doc-1", "--model", "beta/mid", "--json")
    assert evolve.exit_code == 0
    assert as_json(evolve)["role"] == "override"
    assert as_json(invoke(home, "source", "done", "doc-1", "--json"))["state"] == "done"
    shown = as_json(invoke(home, "source", "show", "doc-1", "--json"))
    assert shown["attempts"][0]["override"] is True


def test_r_res_9_source_evolve_on_an_unknown_source_creates_nothing_and_spends_no_call(
    home: Path,
) -> None:
    # on a ledger with no database yet: one line, exit 2, no database file made
    typo = invoke(home, "source", "evolve", "doc-l", "--model", "beta/mid")
    assert (typo.exit_code, typo.output) == (2, "ledger: unknown source\n")
    assert not (home / "ledger.db").exists()
    assert invoke(home, "source", "add", "doc-1").exit_code == 0
    typo = invoke(home, "source", "evolve", "doc-l", "--model", "beta/mid", "--json")
    assert (typo.exit_code, as_json(typo)["error"]["message"]) == (2, "unknown source")
    conn = sqlite_driver.connect(home / "ledger.db")
    try:
        assert conn.execute("SELECT id FROM sources").fetchall() == [("doc-1",)]
        assert conn.execute("SELECT count(*) FROM reservations").fetchall() == [(0,)]
    finally:
        conn.close()


def test_sql_injection_shaped_id_round_trips(home: Path) -> None:
    sid = "x'); DROP TABLE sources;--"
    assert invoke(home, "reserve", sid, "--model", "alpha/small").exit_code == 0
    shown = as_json(invoke(home, "source", "show", sid, "--json"))
    assert shown["id"] == sid


def test_issue33_source_show_json_has_no_contradicting_queued_flag(home: Path) -> None:
    """A source made by `reserve` (not `source add`) showed `"state": "queued", "queued": false`:
    the flag says what it means, `in_worker_queue`."""
    assert invoke(home, "reserve", "only-api", "--model", "alpha/small").exit_code == 0
    shown = as_json(invoke(home, "source", "show", "only-api", "--json"))
    assert shown["state"] == "queued"
    assert shown["in_worker_queue"] is False
    assert "queued" not in shown
