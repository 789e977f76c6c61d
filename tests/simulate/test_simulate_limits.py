"""R-SIM-4 (issue 29 items 14 and 16): bad or extreme simulation input is one line naming the file,
the field and the rule (exit 2), and nothing is simulated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.simulate.limits import MAX_SPAN_MS

SPAN_RULE = "must be at most 2678400000 (31 days in ms: the longest span a simulation replays)"


def simulate(tmp_path: Path, document: dict[str, Any], *extra: str) -> tuple[int, list[str]]:
    path = tmp_path / "input.json"
    path.write_text(json.dumps(document))
    result = CliRunner().invoke(
        cli, ["--home", str(tmp_path / "h"), "simulate", "--trace", str(path), *extra]
    )
    return result.exit_code, result.stderr.splitlines()


def trace(*attempts: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": "ledger-trace",
        "version": 1,
        "attempts": [{"source": 1, "model": "alpha/m", **a} for a in attempts],
        "arrivals": [{"atMs": 0, "source": 1}],
    }


def scenario(**keys: Any) -> dict[str, Any]:
    return {"format": "ledger-scenario", "version": 1, "start": "2027-01-15T06:00Z", **keys}


@pytest.mark.parametrize(
    ("attempt", "field", "rule"),
    [
        ({"atMs": 0, "inputBytes": 10**13}, "attempts[0].inputBytes",
         "must be at most 1099511627776 (the largest request size the ledger accepts)"),
        ({"atMs": 0, "outputTokens": 10**13}, "attempts[0].outputTokens",
         "must be at most 1000000000000 (the largest token count the ledger accepts)"),
        ({"atMs": 10**13}, "attempts[0].atMs", SPAN_RULE),
        ({"atMs": MAX_SPAN_MS + 1}, "attempts[0].atMs", SPAN_RULE),
        ({"atMs": 0, "durationMs": 10**13}, "attempts[0].durationMs", SPAN_RULE),
    ],
)  # fmt: skip
def test_r_sim_4_trace_values_outside_the_limits(
    tmp_path: Path, attempt: dict[str, Any], field: str, rule: str
) -> None:
    code, lines = simulate(tmp_path, trace(attempt))
    assert code == 2
    assert lines == [f"ledger: {tmp_path / 'input.json'}: {field}: {rule}"]


def test_r_sim_4_a_trace_at_the_limit_is_accepted(tmp_path: Path) -> None:
    code, lines = simulate(tmp_path, trace({"atMs": 0, "inputBytes": 1 << 40}), "--drain-for", "0s")
    assert (code, lines) == (0, [])


@pytest.mark.parametrize(
    ("arrivals", "field"),
    [
        ([{"at": "30:00", "count": 5}], "arrivals[0].at"),  # after the span (issue 29 item 16)
        ([{"at": "06:00", "count": 1}, {"at": "05:00", "count": 5}], "arrivals[1].at"),  # before
        ([{"from": "06:00", "until": "07:30", "perHour": 10}], "arrivals[0].until"),
        ([{"from": "05:59", "until": "07:00", "perHour": 10}], "arrivals[0].from"),
    ],
)
def test_r_sim_4_scenario_arrivals_outside_the_span(
    tmp_path: Path, arrivals: list[dict[str, Any]], field: str
) -> None:
    code, lines = simulate(tmp_path, scenario(hours=1, arrivals=arrivals))
    assert code == 2
    assert lines == [
        f"ledger: {tmp_path / 'input.json'}: {field}: "
        "must be within the simulated span (from `start`, for `hours`)"
    ]


def test_r_sim_4_scenario_arrivals_at_the_span_edges_are_kept(tmp_path: Path) -> None:
    arrivals = [{"at": "06:00", "count": 2}, {"from": "06:00", "until": "07:00", "perHour": 2},
                {"at": "07:00", "count": 3}]  # fmt: skip
    path = tmp_path / "input.json"
    path.write_text(json.dumps(scenario(hours=1, arrivals=arrivals)))
    result = CliRunner().invoke(
        cli, ["--home", str(tmp_path / "h"), "simulate", "--trace", str(path), "--json",
              "--drain-for", "0s"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["current"]["sources"] == 7


def test_r_sim_4_drain_for_beyond_the_span_limit(tmp_path: Path) -> None:
    code, lines = simulate(tmp_path, trace({"atMs": 0}), "--drain-for", "32d")
    assert code == 2
    assert lines == ["ledger: --drain-for: must be at most 31d (R-SIM-4)"]


def test_r_sim_4_trace_schema_states_the_limits() -> None:
    schema = json.loads(CliRunner().invoke(cli, ["simulate", "schema", "--of", "trace"]).output)
    attempt = schema["$defs"]["TraceAttempt"]["properties"]
    sizes = [s for s in attempt["inputBytes"]["anyOf"] if s.get("type") == "integer"]
    assert sizes[0]["maximum"] == 1 << 40
    assert attempt["atMs"]["maximum"] == MAX_SPAN_MS


def test_r_sim_4_trace_export_refuses_more_than_a_trace_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.simulate import export

    home = ["--home", str(tmp_path / "h")]
    for source in ("a", "b"):
        assert CliRunner().invoke(cli, [*home, "source", "add", source]).exit_code == 0
    monkeypatch.setattr(export, "MAX_ENTRIES", 1)
    result = CliRunner().invoke(cli, [*home, "trace", "export"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "ledger: more than 1 attempts or arrivals in that window (the most a trace holds, "
        "R-SIM-4); export a shorter one with --since"
    ]
