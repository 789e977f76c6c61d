"""R-GW-2 / R-RES-1 through the gateway: exact budgets under real concurrency, and R-GW-7's
`kill -9` mid-stream (the reservation expires at its deadline and stays counted)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway
from tests.support.serving import running

CALLER = r"""
import json, sys, threading, httpx
url, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = []
barrier = threading.Barrier(n)
def one():
    barrier.wait()
    try:
        r = httpx.post(url + "/openai/v1/chat/completions", timeout=120,
                       headers={"authorization": "Bearer " + token},
                       json={"model": "acme/a1", "messages": [{"role": "user", "content": "x"}]})
    except httpx.TransportError as exc:  # a reset or a close without an answer: a row too
        out.append([type(exc).__name__, None, None])
        return
    body = r.json()
    code = body["error"]["code"] if r.status_code != 200 else None
    out.append([r.status_code, code, r.headers.get("retry-after")])
threads = [threading.Thread(target=one) for _ in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
"""


def test_r_gw_2_two_hundred_concurrent_requests_reach_upstream_exactly_twenty_times(
    home: Path,
) -> None:
    with StandIn() as standin, gateway(home, standin, callsPerHour=20) as gw:
        per = [13] * 8 + [12] * 8  # 200 requests from 16 processes
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CALLER, gw.url, gw.token, str(n)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in per
        ]
        results = [row for p in procs for row in json.loads(p.communicate(timeout=300)[0])]
        assert len(results) == 200
        statuses = Counter(status for status, _, _ in results)
        # every one answered, none reset (R-SRV-9: the fan-out is past the strangers' pool)
        assert statuses == {200: 20, 429: 180}, statuses
        refusals = [(code, after) for status, code, after in results if status == 429]
        assert all(code == "shared_hourly_budget" for code, _ in refusals)
        assert all(after is not None and int(after) > 0 for _, after in refusals)
        assert len(standin.requests) == 20


def test_r_gw_7_kill_9_mid_stream_leaves_the_reservation_to_expire_counted(home: Path) -> None:
    slow = Scripted(text="x" * 100, stream_pieces=100, event_delay_s=0.2)
    with StandIn({"a1": [slow]}) as standin:
        policy = {"timeoutMs": 3000}
        with gateway(home, standin, **policy) as gw, httpx.stream(
            "POST", gw.url + "/openai/v1/chat/completions",
            headers={"authorization": f"Bearer {gw.token}"},
            json={"model": "acme/a1", "stream": True,
                  "messages": [{"role": "user", "content": "x"}]},
            timeout=30,
        ) as answer:  # fmt: skip
            lines = answer.iter_lines()
            assert next(lines).startswith("data: ")
            gw.served.proc.send_signal(signal.SIGKILL)
            gw.served.proc.wait(30)
        with Ledger.open(home).db.engine.connect() as conn:
            status, deadline = conn.exec_driver_sql(
                "SELECT status, deadline_ms FROM reservations"
            ).one()
        assert status == "open"  # nobody settled it
        time.sleep(max(0.0, deadline / 1000 - time.time()) + 0.5)
        with running(home) as served, served.client() as http:
            used = http.get("/v1/status").json()["hourly"]["used"]
            again = http.post("/v1/reserve", json={"source": "after", "model": "acme/a1"})
            assert again.status_code == 200
        assert used == 1  # the killed stream's slot still counts
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT status FROM reservations ORDER BY id").all()
    assert next(r[0] for r in rows) == "expired"  # expired at its deadline, still counted
    assert len(rows) == 2
