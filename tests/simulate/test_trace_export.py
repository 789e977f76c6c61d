"""Issue 23 / R-SIM-2: `ledger trace export` writes a ledger's own history as a trace, on SQLite
and PostgreSQL, with relative times, numbered sources, hints — and never text or ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.classify import Classification
from ledger.cli.main import cli
from ledger.kinds import FailureKind
from ledger.records import Failed, Success
from tests.support.backends import BACKENDS
from tests.support.ledgers import Clock, LedgerFactory

pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)

SECRET_SOURCE = "customer-4711/transcript-private.txt"
PAYLOAD = "PAYLOAD-TEXT-NEVER-EXPORTED"


def _history(make_ledger: LedgerFactory, clock: Clock) -> None:
    ledger = make_ledger()
    ledger.add_source(SECRET_SOURCE, PAYLOAD)
    ledger.add_source("second", None)
    first = ledger.reserve(SECRET_SOURCE, "alpha/small", input_bytes=900)
    clock.advance(1_500)
    ledger.settle(first.id, Failed(Classification(FailureKind.RATE_LIMIT, "http_429",
                                                  retry_after_ms=300_000)))
    clock.advance(10)
    backup = ledger.reserve(SECRET_SOURCE, "beta/mid", input_bytes=900,
                            fallback_from="alpha/small", after=first.id)
    clock.advance(700)
    ledger.settle(backup.id, Success(100, 20, None))
    clock.advance(3_600_000)  # an hour later: only this one falls in `--since 30m`
    late = ledger.reserve("second", "beta/mid", input_bytes=50)
    clock.advance(200)
    ledger.settle(late.id, Success(10, 2, 0.001))


def _export(home: Path, *args: str) -> dict[str, object]:
    result = CliRunner().invoke(cli, ["--home", str(home), "trace", "export", *args])
    assert result.exit_code == 0, result.output
    document: dict[str, object] = json.loads(result.output)
    return document


def test_r_sim_2_trace_export_lists_attempts_and_arrivals_without_ids_or_text(
    home: Path, make_ledger: LedgerFactory, clock: Clock
) -> None:
    _history(make_ledger, clock)
    clock.advance(1)
    trace = _export(home)
    assert trace["format"] == "ledger-trace"
    assert trace["version"] == 1
    text = json.dumps(trace)
    assert SECRET_SOURCE not in text
    assert PAYLOAD not in text
    assert "second" not in text
    attempts = trace["attempts"]
    assert isinstance(attempts, list)
    assert [(a["atMs"], a["source"], a["model"], a["role"], a["status"], a.get("kind"))
            for a in attempts] == [
        (0, 1, "alpha/small", "primary", "failed", "rate_limit"),
        (1_510, 1, "beta/mid", "fallback", "succeeded", None),
        (3_602_210, 2, "beta/mid", "primary", "succeeded", None),
    ]
    failed, backup, late = attempts
    assert failed["subkind"] == "http_429"
    assert failed["retryAfterMs"] == 300_000  # the hint set the model's cooldown
    assert failed["durationMs"] == 1_500
    assert failed["inputBytes"] == 900
    assert backup["fallbackFrom"] == "alpha/small"
    assert (backup["inputTokens"], backup["outputTokens"]) == (100, 20)
    assert late["costUsd"] == 0.001
    assert late["costKnown"] is True
    arrivals = trace["arrivals"]
    assert isinstance(arrivals, list)
    assert [(a["atMs"], a["source"]) for a in arrivals] == [(0, 1), (0, 2)]


def test_r_sim_2_trace_export_since_keeps_the_window_and_its_sources(
    home: Path, make_ledger: LedgerFactory, clock: Clock
) -> None:
    _history(make_ledger, clock)
    trace = _export(home, "--since", "30m")
    attempts = trace["attempts"]
    assert isinstance(attempts, list)
    # the trace starts at the window's start; the ledger's newest time is the last settle
    assert [(a["atMs"], a["model"]) for a in attempts] == [(30 * 60_000 - 1 - 200, "beta/mid")]
    assert trace["arrivals"] == [{"atMs": 0, "source": 1}]  # arrived earlier: at the window start


def test_r_sim_2_trace_export_to_a_file_and_bad_since(
    home: Path, make_ledger: LedgerFactory, clock: Clock, tmp_path: Path
) -> None:
    _history(make_ledger, clock)
    out = tmp_path / "trace.json"
    result = CliRunner().invoke(
        cli, ["--home", str(home), "trace", "export", "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"out": str(out), "attempts": 3, "arrivals": 2}
    assert json.loads(out.read_text())["format"] == "ledger-trace"
    bad = CliRunner().invoke(cli, ["--home", str(home), "trace", "export", "--since", "soon"])
    assert bad.exit_code == 2
    assert "invalid duration" in bad.output
