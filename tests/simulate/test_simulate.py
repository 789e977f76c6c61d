"""Issue 23 / R-SIM-1, R-SIM-3: `ledger simulate` runs the real code in virtual time, reports two
policies side by side, is deterministic, and moves its figures the way arithmetic says."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.catalog import Catalog
from ledger.cli.main import cli
from ledger.simulate.simulation import simulate
from tests.support.simulation import CATALOG, _policy, _scenario

HOUR_MS = 3_600_000


def test_r_sim_1_halving_calls_per_hour_halves_the_calls_of_a_saturated_queue(
    tmp_path: Path,
) -> None:
    catalog = Catalog.model_validate(CATALOG)
    result = simulate(
        _scenario(tmp_path), _policy(callsPerHour=40), catalog,
        candidate=_policy(callsPerHour=20), drain_for_ms=0,
    ).document
    current, candidate = result["current"], result["candidate"]
    # 2.5 h of a queue that never empties: a full hour's budget at 0 h, 1 h and 2 h
    assert (current["calls"], current["done"]) == (3 * 40, 3 * 40)
    assert (candidate["calls"], candidate["done"]) == (3 * 20, 3 * 20)
    assert current["estimatedCostUsd"] == pytest.approx(2 * candidate["estimatedCostUsd"])
    assert current["unfinished"] == 200 - 120
    assert candidate["unfinished"] == 200 - 60
    assert current["refusals"]["shared_hourly_budget"] > 0
    assert current["timeToDrain"] is None


def test_r_sim_1_time_to_drain_follows_the_hourly_budget(tmp_path: Path) -> None:
    catalog = Catalog.model_validate(CATALOG)
    result = simulate(
        _scenario(tmp_path), _policy(callsPerHour=40), catalog,
        candidate=_policy(callsPerHour=20), drain_for_ms=24 * HOUR_MS,
    ).document
    current, candidate = result["current"], result["candidate"]
    assert (current["done"], candidate["done"]) == (200, 200)
    # item i of batch j is reserved at (j h + i s) and takes 1 s: 5 batches of 40, 10 of 20
    assert current["timeToDrainMs"] == (4 * 3600 + 39 + 1) * 1000
    assert candidate["timeToDrainMs"] == (9 * 3600 + 19 + 1) * 1000


def test_r_sim_1_an_outage_moves_calls_to_the_backup_and_cools_the_primary(
    tmp_path: Path,
) -> None:
    catalog = Catalog.model_validate(CATALOG)
    scenario = _scenario(
        tmp_path,
        windows=[{"target": "alpha", "from": "00:00", "for": "30m", "status": 503}],
        arrivals=[{"from": "00:00", "until": "01:00", "perHour": 120}],
    )
    doc = simulate(
        scenario, _policy(callsPerHour=1000), catalog,
        candidate=_policy(callsPerHour=1000, crossProviderFallback=False), drain_for_ms=0,
    ).document
    current, candidate = doc["current"], doc["candidate"]
    assert current["fallbacks"].get("alpha/m -> beta/b", 0) > 0
    assert current["callsByModel"]["beta/b"] > 0
    assert current["longestCooldown"]["target"] == "alpha/m"
    assert current["longestCooldown"]["kind"] == "transport"
    assert candidate["fallbacks"] == {}
    assert "beta/b" not in candidate["callsByModel"]
    assert candidate["failedByKind"]["transport"] > 0
    assert current["done"] == 120  # every arrival finished within the hour, on one route or other


def _cli(home: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--home", str(home), "simulate", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_r_sim_3_same_inputs_and_seed_give_byte_identical_json_and_svg(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "catalog.json").write_text(json.dumps(CATALOG))
    (home / "recovery.json").write_text(json.dumps({"defaultModel": "alpha/m",
                                                     "callsPerHour": 300}))
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps({"defaultModel": "beta/b", "callsPerHour": 300}))
    scenario = _scenario(
        tmp_path,
        latency={"medianMs": 1500, "p95Ms": 5000},
        tokens={"input": [500, 3000], "output": [50, 400]},
        windows=[{"target": "alpha", "from": "00:20", "for": "25m", "status": 529,
                  "probability": 0.5},
                 {"target": "beta/b", "from": "01:00", "until": "01:30", "status": 429,
                  "retryAfterS": 90, "probability": 0.4}],
        arrivals=[{"from": "00:00", "until": "02:00", "perHour": 150, "poisson": True},
                  {"at": "00:30", "count": 40}],
    )
    runs = []
    for n in (1, 2):
        svg = tmp_path / f"timeline{n}.svg"
        out = _cli(home, "--trace", str(scenario), "--policy", str(candidate), "--seed", "42",
                   "--json", "--timeline", str(svg))
        runs.append((out, svg.read_bytes()))
    assert runs[0] == runs[1]
    assert threading.active_count() == 1  # no heartbeat or other thread was left behind
    other = _cli(home, "--trace", str(scenario), "--policy", str(candidate), "--seed", "43",
                 "--json")
    assert other != runs[0][0]  # the seed matters
    document = json.loads(runs[0][0])
    assert document["format"] == "ledger-simulation"
    assert document["candidate"]["callsByModel"]["beta/b"] > 0
    assert runs[0][1].startswith(b"<svg")
    text = _cli(home, "--trace", str(scenario), "--policy", str(candidate), "--seed", "42")
    assert "current" in text
    assert "candidate" in text
    assert "calls on failing targets" in text


def test_r_sim_1_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "ledger-scenario", "version": 1,
                               "start": "2027-01-15T00:00Z",
                               "windows": [{"target": "alpha", "from": "00:00",
                                            "for": "1h", "sk-live-secret": 1}]}))
    result = CliRunner().invoke(cli, ["--home", str(home), "simulate", "--trace", str(bad)])
    assert result.exit_code == 2
    assert "sk-live-secret" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    missing = CliRunner().invoke(cli, ["--home", str(home), "simulate"])
    assert missing.exit_code == 2


def test_r_sim_2_scenario_schema_is_printed() -> None:
    result = CliRunner().invoke(cli, ["simulate", "schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema["title"] == "ledger simulation scenario"
    assert "windows" in schema["properties"]
    trace = json.loads(CliRunner().invoke(cli, ["simulate", "schema", "--of", "trace"]).output)
    assert trace["title"] == "ledger trace"


def test_r_sim_1_timeline_has_time_labels_and_durations_use_the_cli_format(
    tmp_path: Path,
) -> None:
    """Issue 33: the timeline picture had no time labels on its x-axis, and simulate wrote
    durations as `5h21m18s619ms` where the CLI and the page write `5h21m`: the axis is labelled
    with the time since the start, and every duration is `human_duration_ms`."""
    import re

    from ledger.clock import human_duration_ms
    from ledger.simulate.timeline import render_svg, time_ticks

    catalog = Catalog.model_validate(CATALOG)
    scenario = _scenario(
        tmp_path, arrivals=[{"at": "00:00", "count": 30}],
        windows=[{"target": "alpha", "from": "00:00", "for": "20m", "status": 503,
                  "probability": 0.5}],
    )  # fmt: skip
    sim = simulate(scenario, _policy(callsPerHour=40), catalog,
                   candidate=_policy(callsPerHour=20), drain_for_ms=0)
    svg = render_svg(sim.comparison)
    labels = re.findall(r'<text [^>]*class="tick">([^<]+)</text>', svg)
    assert labels[0] == "0"
    assert len(labels) >= 2 * 3  # both panels, several ticks each
    for label in labels[1:]:
        if label != "0":
            assert label == "+" + human_duration_ms(parse_ms(label[1:]))
    assert time_ticks(150 * 60_000) == [m * 60_000 for m in range(0, 151, 30)]
    for run in (sim.document["current"], sim.document["candidate"]):
        longest = run["longestCooldown"]
        assert run["timeToDrain"] == human_duration_ms(run["timeToDrainMs"])
        assert longest is not None
        assert longest["duration"] == human_duration_ms(longest["ms"])


def parse_ms(text: str) -> int:
    from ledger.clock import parse_duration_ms

    return parse_duration_ms(text)
