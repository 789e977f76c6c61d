"""SPEC section 14: `ledger demo` runs the real worker over real HTTP against the local stand-in
and ends with a status that shows fallback, cooldowns, a paused source and budgets kept."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.demo import DEMO_POLICY, run_demo
from ledger.worker.queue import DrainSummary


@pytest.fixture(scope="module")
def demo_doc() -> dict[str, Any]:
    """One in-process demo run (its temporary state directory discarded), as its JSON document."""
    return run_demo(discard=True).to_json()


def test_spec_14_demo_is_fast_and_uses_real_http(demo_doc: dict[str, Any]) -> None:
    assert demo_doc["wall_ms"] < 30_000
    assert demo_doc["kept"] is False
    assert not Path(demo_doc["home"]).exists()
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
    paused = {s["id"]: s["pause_reason"] for s in status["sources"]["list"]
              if s["state"] == "paused"}  # fmt: skip
    assert paused == {"demo-02": "output_failures", "demo-09": "safety:content_policy_violation"}
    assert len(status["cooldowns"]) >= 1
    # the transport cooldown ended during the demo and a recovery probe found the model back
    assert {c["kind"] for c in status["cooldowns"]} == {"auth", "rate_limit", "quota",
                                                         "request_rejected"}
    assert status["hourly"]["used"] <= status["hourly"]["limit"] == DEMO_POLICY["callsPerHour"]
    assert status["daily"]["spent_usd"] <= status["daily"]["ceiling_usd"]
    assert facts["hourly_used"] <= facts["hourly_limit"]
    assert facts["daily_spent_usd"] <= facts["daily_ceiling_usd"]


def test_issue24_item5_demo_shows_a_probe_a_safety_pause_and_a_credit_balance_quota(
    demo_doc: dict[str, Any],
) -> None:
    status = demo_doc["status"]
    messages = [n["message"] for n in status["notices"]]
    assert "recovery probe succeeded on model cirrus/lite-2" in messages
    recent = [(a["source"], a["model"], a["kind"], a["subkind"]) for a in status["recent"]]
    # down for a second (503 asking for 1 s), then probed once and serving again
    assert ("demo-05", "cirrus/lite-2", "transport", "server_error") in recent
    assert ("demo-07", "cirrus/lite-2", None, None) in recent
    # the content-policy 400 is the safety row: paused, nothing else tried for demo-09
    assert [r for r in recent if r[0] == "demo-09"] == [
        ("demo-09", "cirrus/lite-2", "safety", "content_policy_violation")
    ]
    # Anthropic's credit-balance 400 is quota: the provider cools, not one model
    assert ("demo-06", "dyna/sage-1", "quota", "credit_balance_too_low") in recent
    cooled = {(c["scope"], c["target"]): c["kind"] for c in status["cooldowns"]}
    assert cooled[("provider", "dyna")] == "quota"
    health = {(h["scope"], h["target"]): h for h in status["health"]}
    assert health[("provider", "dyna")]["state"] == "cooling"
    assert health[("model", "cirrus/lite-2")]["last_success_at"] is not None


def test_spec_14_cli_demo_honours_global_home_and_exits_0(tmp_path: Path) -> None:
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
    result = CliRunner().invoke(cli, ["demo", "--home", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    home = tmp_path / "d"
    assert result.output.startswith(
        "[worker] 13 items: 10 done, 1 failed (retry later), 2 paused; 6 fallbacks, 1 correction;"
        " failed calls: 1x auth/http_401 on acme, "
    )
    assert f"$ ledger --home {home} status" in result.output


def test_issue15_item1_demo_keeps_its_state_and_prints_the_follow_up_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # re-read TMPDIR
    try:
        result = CliRunner().invoke(cli, ["demo", "--sources", "3"])
    finally:
        tempfile.tempdir = None
    assert result.exit_code == 0, result.output
    (home,) = tmp_path.glob("ledger-demo-*")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    lines = result.output.splitlines()
    tail = lines[-12:-4]  # then the four lines of issue 33's `ledger standin` follow-up
    assert lines[-3].startswith("  ledger standin --port ")
    assert tail == [
        f"[demo] state kept in {home}; look around with:",
        f"  ledger --home {home} status",
        f"  ledger --home {home} source show demo-02",
        f"  ledger --home {home} cooldown list",
        f"  rm -r {home}    # when done",
        "[demo] its status page, as one file or served at / by the service:",
        f"  ledger --home {home} status --html {home}/status.html",
        f"  ledger --home {home} serve",
    ]
    # the printed follow-up shows the demo's ledger, not an empty one
    after = CliRunner().invoke(cli, ["--home", str(home), "status", "--json"])
    assert after.exit_code == 0, after.output
    # the three sources, and the source of the demo's one gateway request (SPEC section 19)
    assert sum(json.loads(after.output)["sources"]["counts"].values()) == 3 + 1
    shown = CliRunner().invoke(cli, ["--home", str(home), "source", "show", "demo-02"])
    assert shown.exit_code == 0, shown.output


def test_issue15_item1_demo_discard_removes_its_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--sources", "2", "--discard", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["kept"] is False
    assert not Path(doc["home"]).exists()
    both = CliRunner().invoke(cli, ["demo", "--discard", "--home", str(tmp_path / "x")])
    assert both.exit_code == 2
    assert not (tmp_path / "x").exists()


def test_issue15_item2_summary_adds_up_with_plurals() -> None:
    summary = DrainSummary(items=1, done=1, corrections=1, fallbacks=1)
    assert summary.progress_line() == "[worker] 1 item: 1 done; 1 fallback, 1 correction"
    summary = DrainSummary(
        items=9, done=2, failed=2, paused=1, refused=1, unroutable=1, late=1, cancelled=1
    )
    line = summary.progress_line()
    counted = sum(int(part.split()[0]) for part in line.split(": ", 1)[1].split(";")[0].split(", "))
    assert counted == summary.items
    assert line.startswith("[worker] 9 items: 2 done, 2 failed (retry later), 1 paused, 1 refused")
    assert DrainSummary().progress_line() == "[worker] nothing due"


def test_issue15_item2_summary_adds_up_for_every_item_outcome() -> None:
    """Every outcome is counted in the line, `commit_failed` (issue 12 item 1) included; an
    unroutable item is not claimed to be cooling (it may have no catalog, or no allowed route)."""
    from ledger.worker.queue import ItemOutcome, ItemReport

    summary = DrainSummary()
    for outcome in ItemOutcome:
        summary.add(ItemReport("s", outcome))
    line = summary.progress_line()
    parts = line.split(": ", 1)[1].split(";")[0].split(", ")
    assert sum(int(part.split()[0]) for part in parts) == summary.items == len(ItemOutcome), line
    assert "1 commit failed (retry later)" in parts
    assert "1 unroutable (no eligible route)" in parts


def test_issue15_item2_summary_printed_once_on_a_terminal(tmp_path: Path) -> None:
    """A real pseudo-terminal on stderr: the progress line is erased, the summary printed once."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ledger", "demo", "--home", str(tmp_path / "d"),
             "--sources", "3"],
            stdout=subprocess.PIPE, stderr=follower, timeout=120, check=False,
        )
        os.close(follower)
        follower = -1
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert proc.returncode == 0
    out = proc.stdout.decode()
    assert out.count("[worker] ") == 1
    assert b"[worker] " in seen  # the progress line was drawn on the terminal ...
    assert seen.rstrip(b" ").endswith(b"\r")  # ... and erased at the end


def test_r_gw_demo_ends_with_one_gateway_request_shown() -> None:
    result = CliRunner().invoke(cli, ["demo", "--discard", "--sources", "3"])
    assert result.exit_code == 0, result.output
    last = [line for line in result.output.splitlines() if line.startswith("[demo] gateway:")]
    assert len(last) == 1
    assert "POST /openai/v1/chat/completions model=acme/swift-1 -> 200, answered by" in last[0]


def test_issue33_summary_says_why_calls_failed() -> None:
    """The text summary said "2 failed (retry later)" without why: it counts the failed calls
    by kind/subkind and provider (most frequent first; the rest are in --json `failures`)."""
    from ledger.attempt import AttemptReport
    from ledger.kinds import AttemptRole
    from ledger.worker.queue import ItemOutcome, ItemReport

    summary = DrainSummary()
    connect = AttemptReport(
        1, "local/m1", AttemptRole.PRIMARY, "transport", subkind="connect_error"
    )
    for _ in range(2):
        summary.add(ItemReport("s", ItemOutcome.FAILED, (connect,)))
    summary.add(ItemReport("t", ItemOutcome.DONE, (
        AttemptReport(2, "acme/x", AttemptRole.PRIMARY, "rate_limit", subkind="http_429"),
        AttemptReport(3, "local/m1", AttemptRole.FALLBACK, None))))  # fmt: skip
    line = summary.progress_line()
    assert line.endswith(
        "; failed calls: 2x transport/connect_error on local, 1x rate_limit/http_429 on acme"
    )
    assert summary.to_json()["failures"] == {
        "rate_limit/http_429 on acme": 1, "transport/connect_error on local": 2}  # fmt: skip


def test_issue33_demo_suggests_a_serve_that_works_with_what_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the Quickstart's `pip install -e .` the demo's suggested `ledger --home … serve`
    answered "needs the serve extra": without the extra, the line installing it comes first."""
    from ledger.cli import demo_cmd

    monkeypatch.setattr(demo_cmd, "serve_extra_installed", lambda: False)
    result = CliRunner().invoke(cli, ["demo", "--home", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    serve = lines.index(f"  ledger --home {tmp_path / 'd'} serve")
    assert lines[serve - 1].startswith("  python -m pip install -e '.[serve]'")
    monkeypatch.setattr(demo_cmd, "serve_extra_installed", lambda: True)
    again = CliRunner().invoke(cli, ["demo", "--home", str(tmp_path / "e")])
    assert "pip install" not in again.output


def test_issue33_ledger_standin_lets_the_kept_demo_ledger_go_on_working(tmp_path: Path) -> None:
    """The kept demo directory's catalog points at the stand-in's dead port, so `worker run`
    there only cooled models: `ledger standin --port N` (SPEC 13) runs the stand-in on its own,
    and the demo's next steps, followed as printed, drain a new source against it."""
    import re
    import shlex
    import signal

    home = tmp_path / "d"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    demo = subprocess.run([sys.executable, "-m", "ledger", "demo", "--home", str(home)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert demo.returncode == 0, demo.stderr
    steps = demo.stdout.split("to go on working against it", 1)[1].splitlines()[1:4]
    port = re.fullmatch(r"  ledger standin --port (\d+)", steps[0])
    assert port is not None, steps
    standin = subprocess.Popen(
        [sys.executable, "-m", "ledger", "standin", "--port", port[1]],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        assert standin.stderr is not None
        line = standin.stderr.readline()
        assert line.startswith(f"stand-in listening on http://127.0.0.1:{port[1]} "), line
        for step in steps[1:]:
            words = shlex.split(step)
            extra = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
            argv = [w for w in words if w not in {f"{k}={v}" for k, v in extra.items()}]
            assert argv[0] == "ledger"
            ran = subprocess.run([sys.executable, "-m", "ledger", *argv[1:], "--json"]
                                 if "worker" in argv else [sys.executable, "-m", "ledger",
                                                           *argv[1:]],
                                 capture_output=True, text=True, timeout=300,
                                 env={**env, **extra}, check=False)  # fmt: skip
            assert ran.returncode == 0, ran.stdout + ran.stderr
        assert json.loads(ran.stdout)["done"] == 1  # more-1 was worked against the stand-in
    finally:
        standin.send_signal(signal.SIGTERM)
        assert standin.wait(timeout=30) == 0
        if standin.stderr is not None:
            standin.stderr.close()
