"""R-DIAG-1 through a real `ledger serve`: a flood of gateway refusals is counted by reason, the
scope that refused and the key that asked, and reaches `ledger status` (text, --json,
--prometheus), the page and `/metrics`, at the cost of a few writes, not one per refusal."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway_setup import Gateway
from tests.support.refusal_setup import CHAT, SCOPE, refusing_gateway

FLOOD = 400
THREADS = 8
WAIT_S = 300.0  # generous: a loaded 2-core machine


def _samples(gw: Gateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(gw.url + "/metrics", headers={"authorization": f"Bearer {gw.token}"},
                     timeout=60).text  # fmt: skip
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _steps_written(gw: Gateway) -> float:
    """Reserves, settles and count flushes written by the service's group committer."""
    return _samples(gw)[("ledger_commit_batch_size_sum", ())]


BODY = {"model": "acme/a1", "messages": [{"role": "user", "content": "x"}]}


def _flood(gw: Gateway, key: str) -> list[int]:
    statuses: list[int] = []

    def send(n: int) -> None:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            for _ in range(n):
                answer = http.post(CHAT, headers={"authorization": f"Bearer {key}"}, json=BODY)
                statuses.append(answer.status_code)

    threads = [threading.Thread(target=send, args=(FLOOD // THREADS,)) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    return statuses


def _status(home: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "status", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _counted(home: Path) -> dict[str, Any]:
    """`ledger status --json`'s refusals once the service has flushed the whole flood."""
    end = time.monotonic() + WAIT_S
    while True:
        refusals: dict[str, Any] = json.loads(_status(home, "--json"))["refusals"]
        if refusals["total"] >= FLOOD or time.monotonic() > end:
            return refusals
        time.sleep(0.2)


def test_r_diag_1_refusals_a_flood_of_gateway_refusals_is_counted_in_a_few_writes_and_shown(
    home: Path,
) -> None:
    with refusing_gateway(home) as (gw, key):
        before = _steps_written(gw)
        assert _flood(gw, key) == [429] * FLOOD
        refusals = _counted(home)
        assert refusals["total"] == FLOOD
        assert [(r["reason"], r["scope"], r["key"], r["count"]) for r in refusals["by"]] == [
            ("scope_hourly_budget", SCOPE, "sdk", FLOOD)
        ]
        # each refused request was one reserve step (its refusal decided in the write
        # transaction, R-SC-1); counting them added a flush a second at most, not a write each
        extra = _steps_written(gw) - before - FLOOD
        assert 1 <= extra < FLOOD / 4
        samples = _samples(gw)
        assert samples[("ledger_gateway_refusals_total", (("key", "sdk"),
                        ("reason", "scope_hourly_budget"), ("scope", SCOPE)))] == FLOOD  # fmt: skip
        with gw.served.client() as http:  # the page, over the socket
            page = http.get("/").text
        text = _status(home)
        gauges = _status(home, "--prometheus")
    section = page[page.index('<section id="refusals"'):]
    assert f"<strong>{FLOOD}</strong> request(s) refused" in section
    assert '<tr data-refusal="scope_hourly_budget">' in section
    assert f'<tr data-scope="{SCOPE}" class="full">' in page
    assert re.search(rf"scope_hourly_budget\s+{SCOPE}\s+sdk\s+{FLOOD}\s", text)
    assert f"scope {SCOPE} FULL (hourly): calls 1 / 1 this hour" in text
    assert (f'ledger_refusals_1h{{reason="scope_hourly_budget",scope="{SCOPE}",key="sdk"}} '
            f"{FLOOD}") in gauges  # fmt: skip
