"""Issue 33: labels that contradicted each other in `source show` — "correction available" on a done
source and after a 429. A correction (the same model asked again with the output error) is offered
only on a source's first `invalid_output` (ledger/policy_table.py), so the text says so."""

from __future__ import annotations

import json
from pathlib import Path

from ledger.classify import classify_http, classify_kind
from ledger.kinds import AttemptRole
from ledger.records import Failed, Success
from tests.support.ledgers import Clock, LedgerFactory
from tests.support.status_cli import cli_ok


def _correction_line(home: Path, source: str) -> str:
    text = cli_ok(home, "source", "show", source)
    assert "available" not in text
    return next(line for line in text.splitlines() if line.startswith("  backoff steps"))


def test_issue33_no_correction_is_offered_on_a_done_source_or_after_a_429(
    make_ledger: LedgerFactory, clock: Clock, home: Path
) -> None:
    led = make_ledger()
    done = led.reserve("done-1", "alpha/small")
    led.settle(done.id, Success(input_tokens=1, output_tokens=1))
    cli_ok(home, "source", "done", "done-1")
    line = _correction_line(home, "done-1")
    assert json.loads(cli_ok(home, "source", "show", "done-1", "--json"))["state"] == "done"
    assert "correction" not in line  # done, never used: nothing to offer or report

    limited = led.reserve("rl-1", "alpha/small")
    led.settle(limited.id, Failed(classify_http(429, {}, None, clock.ms)))
    line = _correction_line(home, "rl-1")
    assert line.endswith("correction unused (offered if an output fails validation)")

    bad = led.reserve("bad-1", "beta/mid")
    led.settle(bad.id, Failed(classify_kind("invalid_output", "json_schema")))
    fix = led.reserve("bad-1", "beta/mid", role=AttemptRole.CORRECTION)
    clock.advance(1000)
    led.settle(fix.id, Success(input_tokens=1, output_tokens=1))
    cli_ok(home, "source", "done", "bad-1")
    doc = json.loads(cli_ok(home, "source", "show", "bad-1", "--json"))
    assert (doc["state"], doc["correction_used"]) == ("done", True)
    assert _correction_line(home, "bad-1").endswith("correction used (json_schema)")
