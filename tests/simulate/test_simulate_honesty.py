"""Issue 23 / R-SIM-1: honesty — replaying a recorded trace of `ledger demo` through the simulator
(same policy, same catalog, `--replay sequence`, no extra drain time) gives the demo's own counts
back: the same sources done, paused and still queued, the same attempts on the same models, the
same fallbacks, corrections and estimated cost."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.demo import run_demo


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_r_sim_1_replaying_the_demo_trace_gives_the_demo_counts_back(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    result = run_demo(home)
    demo = result.to_json()
    facts = demo["facts"]
    trace_file = tmp_path / "trace.json"
    _invoke("--home", str(home), "trace", "export", "--out", str(trace_file))
    trace = json.loads(trace_file.read_text())
    report = json.loads(_invoke(
        "--home", str(home), "simulate", "--trace", str(trace_file), "--replay", "sequence",
        "--drain-for", "0s", "--json",
    ))
    run = report["current"]
    assert run["sources"] == sum(facts["sources"].values())
    assert run["done"] == facts["sources"].get("done", 0)
    assert run["paused"] == facts["sources"].get("paused", 0)
    assert run["unfinished"] == facts["sources"].get("queued", 0)
    # the demo ends with one gateway request (R-GW-*, after its facts were taken): its attempt is
    # in the trace under a source of its own that no queue item holds, so the replay has 1 fewer
    assert result.gateway.startswith("POST /openai/v1/chat/completions")
    assert run["calls"] == facts["attempts"] == len(trace["attempts"]) - 1
    # the gateway's attempt came after the worker drained: the worker's are the earlier ones
    worker_attempts = sorted(trace["attempts"], key=lambda a: a["atMs"])[: facts["attempts"]]
    assert sum(run["fallbacks"].values()) == facts["fallbacks"]
    assert run["items"] == {k: v for k, v in demo["worker"].items()
                            if k in run["items"]}
    recorded = Counter(a["model"] for a in worker_attempts)
    assert run["callsByModel"] == dict(sorted(recorded.items()))
    recorded_failed = Counter(a["kind"] for a in worker_attempts if a["status"] == "failed")
    assert run["failedByKind"] == dict(sorted(recorded_failed.items()))
    pairs = Counter(f"{a['fallbackFrom']} -> {a['model']}" for a in worker_attempts
                    if a["role"] == "fallback")
    assert run["fallbacks"] == dict(sorted(pairs.items()))
    assert run["estimatedCostUsd"] == round(facts["daily_spent_usd"], 6)
    assert run["unobservedCalls"] == 0
