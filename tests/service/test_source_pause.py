"""Issue 29 item 13: `source pause` of a source the policy already paused keeps the policy's reason
(e.g. `safety:content_policy_violation`) and says it is already paused; library, CLI, /v1 API and
`LedgerClient` alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.api import Ledger
from ledger.classify import classify_kind
from ledger.client import LedgerClient
from ledger.kinds import FailureKind
from ledger.records import Failed, SourceStateChange
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import LedgerFactory
from tests.support.serving import running

SAFETY = "safety:content_policy_violation"
REASON = "SELECT state, pause_reason FROM sources WHERE id = 's'"


def paused_by_policy(led: Ledger) -> None:
    """Source `s` paused by the policy table: a safety refusal (R-POL-11)."""
    r = led.reserve("s", "alpha/small")
    led.settle(r.id, Failed(classify_kind(FailureKind.SAFETY, "content_policy_violation")))


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_issue29_item13_pause_keeps_the_policy_reason(
    make_ledger: LedgerFactory, home: Path, ledger_db: str | None
) -> None:
    led = make_ledger()
    paused_by_policy(led)
    url = db_url(home, ledger_db)
    assert rows(url, REASON) == [("paused", SAFETY)]
    assert led.set_source_state("s", "pause") == SourceStateChange("s", "paused", True, SAFETY)
    assert rows(url, REASON) == [("paused", SAFETY)]  # not replaced by `manual`
    led.add_source("t")
    assert led.set_source_state("t", "pause") == SourceStateChange("t", "paused", False, "manual")
    assert led.set_source_state("t", "pause") == SourceStateChange("t", "paused", True, "manual")
    assert led.set_source_state("s", "resume") == SourceStateChange("s", "queued", False, None)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_issue29_item13_cli_says_already_paused(make_ledger: LedgerFactory, home: Path) -> None:
    from ledger.cli.main import cli

    paused_by_policy(make_ledger())
    runner = CliRunner()
    text = runner.invoke(cli, ["--home", str(home), "source", "pause", "s"])
    assert text.exit_code == 0, text.output
    assert text.stdout == f"source is already paused ({SAFETY}); left as it is\n"
    doc = runner.invoke(cli, ["--home", str(home), "source", "pause", "s", "--json"])
    assert doc.exit_code == 0, doc.output
    assert json.loads(doc.stdout) == {
        "source": "s", "state": "paused", "already": True, "pause_reason": SAFETY
    }
    shown = runner.invoke(cli, ["--home", str(home), "source", "show", "s", "--json"])
    assert json.loads(shown.stdout)["pause_reason"] == SAFETY


def test_issue29_item13_service_and_client_keep_the_reason(
    make_ledger: LedgerFactory, home: Path
) -> None:
    paused_by_policy(make_ledger())
    with running(home) as served:
        with served.client() as http:
            answer = http.post("/v1/sources/pause", json={"source": "s"})
            assert answer.status_code == 200
            assert answer.json() == {
                "source": "s", "state": "paused", "already": True, "pause_reason": SAFETY
            }
        with LedgerClient(served.socket) as client:
            change = client.set_source_state("s", "pause")
            assert change == SourceStateChange("s", "paused", True, SAFETY)
    assert rows(db_url(home, None), REASON) == [("paused", SAFETY)]
