"""R-GW-2 with R-Q-1, R-DIAG-2, R-SRV-8: a gateway request without `X-Ledger-Source` is its own
source; that source is no queue work. Status (text, JSON, Prometheus, page) counts it apart as
`gateway_one_off`, never as `queued`, and no worker claims it; through a real `ledger serve` on
SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from ledger.cli.main import cli
from ledger.standin.server import StandIn
from tests.support.backends import BACKENDS
from tests.support.gateway_setup import gateway

HELLO: Any = [{"role": "user", "content": "hello"}]
CALLS = 5


def _invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def _status(home: Path) -> dict[str, Any]:
    result = _invoke(home, "status", "--json")
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_gw_2_one_off_gateway_sources_are_no_queued_work(home: Path, tmp_path: Path) -> None:
    """Before: each of these requests left a `gw-…` source counted `queued` for good while the
    page said "Nothing queued"."""
    with StandIn() as standin, gateway(home, standin, defaultModel="acme/a1") as gw:
        assert _invoke(home, "source", "add", "job-1", "--payload", "{}").exit_code == 0
        before = _status(home)["sources"]["counts"]
        assert before["queued"] == 1
        client = gw.openai()
        for _ in range(CALLS - 1):
            client.chat.completions.create(model="acme/a1", messages=HELLO)
        # a repeatable request (Idempotency-Key) gets its source from the key: one-off as well
        repeat = httpx.post(
            gw.url + "/openai/v1/chat/completions",
            json={"model": "acme/a1", "messages": HELLO},
            headers={"Authorization": f"Bearer {gw.token}", "Idempotency-Key": "k-1"},
            timeout=60,
        )
        assert repeat.status_code == 200, repeat.text
        served_page = httpx.get(
            gw.url + "/", headers={"Authorization": f"Bearer {gw.token}"}, timeout=60
        )
    doc = _status(home)
    counts = doc["sources"]["counts"]
    assert counts["queued"] == before["queued"] == 1
    assert counts["gateway_one_off"] == CALLS
    assert sum(counts.values()) == CALLS + 1  # every source counted once
    assert [s["id"] for s in doc["sources"]["list"]] == ["job-1"]  # counted, not listed
    assert [s["id"] for s in doc["queue"]["oldest"]] == ["job-1"]
    text = _invoke(home, "status").output
    assert f"gateway_one_off {CALLS}" in text
    assert "queued 1" in text
    prom = _invoke(home, "status", "--prometheus").output
    assert f'ledger_sources{{state="gateway_one_off"}} {CALLS}' in prom
    assert 'ledger_sources{state="queued"} 1' in prom
    assert served_page.status_code == 200
    assert f"gateway_one_off <strong>{CALLS}</strong>" in served_page.text
    assert "queued <strong>1</strong>" in served_page.text
    # a worker claims the queued work and none of the gateway's sources
    worked = _invoke(home, "worker", "run", "--once", "--json")
    assert worked.exit_code == 0, worked.output
    assert json.loads(worked.output)["items"] == 1
    after = _status(home)["sources"]["counts"]
    assert after["gateway_one_off"] == CALLS
    assert after["leased"] == 0
    assert after["queued"] + after["done"] + after["paused"] == 1  # job-1, wherever it went
