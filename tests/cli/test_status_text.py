"""Issue 15 item 3: the status dashboard at 80 and 100 columns never cuts a time or a kind, keeps
within the width, names its columns plainly and shows measured durations as measured."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.demo import run_demo
from ledger.status.text import render_text, took


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("status-text") / "demo"
    run_demo(home)
    return home


@pytest.fixture(scope="module")
def doc(demo_home: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["--home", str(demo_home), "status", "--json"])
    assert result.exit_code == 0, result.output
    parsed: dict[str, Any] = json.loads(result.output)
    return parsed


def short_time(iso: str) -> str:
    return f"{iso[5:10]} {iso[11:19]}"


def long_keys(doc: dict[str, Any]) -> dict[str, Any]:
    """The same document with 200-character source ids and long model keys everywhere."""
    wide = copy.deepcopy(doc)
    for a in wide["recent"]:
        a["source"] = a["source"] + "-" + "x" * 190
        a["model"] = a["model"] + "-" + "m" * 120
    for s in wide["sources"]["list"]:
        s["id"] = s["id"] + "-" + "x" * 190
    for e in wide["excluded"]:
        e["model"] = e["model"] + "-" + "m" * 120
    for c in wide["cooldowns"]:
        c["target"] = c["target"] + "-" + "m" * 120
    return wide


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("widen", [False, True])
def test_issue15_item3_never_cuts_a_time_or_a_kind(
    doc: dict[str, Any], width: int, widen: bool
) -> None:
    shown = long_keys(doc) if widen else doc
    text = render_text(shown, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    kinds = {f"{a['kind']}/{a['subkind']}" for a in shown["recent"] if a["kind"]}
    assert "request_rejected/context_overflow" in kinds
    for kind in kinds:
        assert re.search(rf"\s{re.escape(kind)}(\s|$)", text, re.MULTILINE), kind
    for e in shown["excluded"]:
        reason = e["reason"] + (f" until {short_time(e['until'])}" if e["until"] else "")
        assert reason in text
    for c in shown["cooldowns"]:
        row = [line for line in lines if f"  {short_time(c['until'])}  {c['kind']} " in line]
        assert len(row) == 1, c
    for s in shown["sources"]["list"]:
        if s["retry_at"] and s["state"] == "queued":
            assert f"retry {short_time(s['retry_at'])}" in text
    for line in lines:  # only an id or a model key is ever cut: a whole cell, ending in `…`
        assert re.fullmatch(r"[^…]*(…(  |$)[^…]*)*", line), line


def test_issue15_item3_plain_headers_and_no_retry_for_a_done_source(doc: dict[str, Any]) -> None:
    text = render_text(doc, 120)  # the demo's gateway source has a long id of its own
    assert "outerr" not in text
    header = next(line for line in text.splitlines() if line.startswith("  source "))
    assert re.split(r"\s{2,}", header.strip()) == [
        "source", "state", "calls", "models", "failures", "bad output", "time used",
        "paused / next retry",
    ]
    done = [s for s in doc["sources"]["list"] if s["state"] == "done" and s["retry_at"]]
    assert done, "the demo leaves a finished source that had a retry time set"
    for s in done:
        row = next(line for line in text.splitlines() if line.startswith(f"  {s['id']} "))
        assert "retry" not in row
        assert row.rstrip().endswith(took(s["time_used_ms"]))


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "-"), (0, "0s"), (25, "25ms"), (999, "999ms"), (1000, "1s"), (1250, "1s"),
     (59_999, "59s"), (60_000, "1m"), (125_000, "2m5s"), (3_600_000, "1h")],
)
def test_issue15_item3_durations_shown_as_measured(ms: int | None, text: str) -> None:
    """Issue 33: the one duration format (`human_duration_ms`), never more than measured (was
    `60.0s` for 59 999 ms and `2m05s` beside the page's `2m 05s`)."""
    assert took(ms) == text


def test_issue15_item3_cli_uses_the_terminal_width(demo_home: Path) -> None:
    for columns, width in (("80", 80), ("100", 100), ("60", 80), ("300", 160)):
        result = CliRunner().invoke(
            cli, ["--home", str(demo_home), "status"], env={"COLUMNS": columns}
        )
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert max(len(line) for line in lines) <= width
        heading = next(line for line in lines if line.startswith("── routes "))
        assert len(heading) == width
    piped = CliRunner().invoke(cli, ["--home", str(demo_home), "status"], env={"COLUMNS": None})
    heading = next(line for line in piped.output.splitlines() if line.startswith("── routes "))
    assert len(heading) == 100


def test_issue15_item3_source_show_never_cuts_a_kind(demo_home: Path) -> None:
    result = CliRunner().invoke(cli, ["--home", str(demo_home), "source", "show", "demo-10"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 100
    row = next(line for line in lines if line.startswith("  #") and "cirrus/lite-2" in line)
    assert "  request_rejected/context_overflow  " in row
    assert re.search(r"  \d+ms$", row), row  # the primary attempt: no role
    assert re.search(r"  \d{2}-\d{2} \d{2}:\d{2}:\d{2}  ", row), row


def test_a_notice_names_its_source(doc: dict[str, Any]) -> None:
    """Two sources failing alike leave two notices; the text tells them apart (R-DIAG-4)."""
    twin = copy.deepcopy(doc)
    failure = {
        "category": "failure", "message": "rate_limit (rate_limit_error) on acme/swift-1",
        "first": "2026-12-01T06:00:00Z", "last": "2026-12-01T06:00:00Z",
        "count": 1,
    }
    twin["notices"] = [
        {**failure, "source": "nightly-a"},
        {**failure, "source": "nightly-b"},
        {**failure, "source": "s" * 200, "category": "pause", "message": "source paused: manual"},
    ]
    lines = [line for line in render_text(twin, 100).splitlines() if "rate_limit (" in line]
    assert len(lines) == 2
    assert lines[0] != lines[1]
    assert lines[0].endswith("(source nightly-a)")
    text = render_text(twin, 80)
    assert "s" * 39 + "…)" in text  # a 200-character id is cut, never spills past the width
    assert all(len(line) <= 80 for line in text.splitlines())
