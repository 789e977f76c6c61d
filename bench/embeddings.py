"""Figure `embeddings` (R-FMT-3, issue 44): `POST /openai/v1/embeddings` through the gateway
against the same call straight to the stand-in, side by side in one run.

- overhead = (gateway call - the same call direct), p50 at concurrency 1, ÷ the in-process
  reserve+settle cycle (≤ 2.0: an embedding costs the gateway little more than the two durable
  commits it must make, as a chat call does, bench/gateway.py).

The in-process cycle is timed in the same loop, one between each pair (bench.gateway's
`_InProcess`), so the load beside the run weighs on both sides alike.

Invariant: the service is a real `ledger serve` subprocess over TCP on its own state directory;
the upstream is the stand-in, keeping its connections alive; nothing is refused.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.common import Row, Settings, Stats, bench_policy, ratio_row, time_row
from bench.contention import percentile
from bench.gateway import _InProcess, _timed_post
from ledger.standin.server import StandIn
from tests.support.embedding_setup import embedding_catalog
from tests.support.serving import running

TARGET = 2.0
BODY: dict[str, Any] = {"model": "acme/e1", "input": ["a memory to embed", "and another one"]}


def run(root: Path, settings: Settings) -> list[Row]:
    """The embeddings overhead against the in-process cycle."""
    inproc = _InProcess(root)
    calls = 20 if settings.quick else 200
    with (
        contextlib.closing(inproc),
        tempfile.TemporaryDirectory(prefix="ledger-emb-") as short,
        StandIn(keep_alive=True) as standin,
    ):
        home = Path(short) / "emb"
        home.mkdir(mode=0o700)
        (home / "catalog.json").write_text(json.dumps(embedding_catalog(standin)))
        (home / "recovery.json").write_text(json.dumps(bench_policy().to_json()))
        with running(home, "--listen", "127.0.0.1:0") as served:
            assert served.url is not None
            auth = {"authorization": f"Bearer {served.token}"}
            gw_url = served.url + "/openai/v1/embeddings"
            direct_url = standin.base_url_openai + "/embeddings"
            direct_body = {**BODY, "model": "e1"}  # what the gateway sends upstream
            over: list[float] = []
            with httpx.Client(headers=auth, timeout=60) as client:
                for _ in range(5):  # warm both paths
                    _timed_post(client, gw_url, BODY)
                    _timed_post(client, direct_url, direct_body)
                for _ in range(calls):
                    gw = _timed_post(client, gw_url, BODY)
                    direct = _timed_post(client, direct_url, direct_body)
                    over.append(gw - direct)
                    inproc.cycle()
    cycle_s = statistics.median(inproc.cycles)
    p50 = percentile(over, 0.5)
    ratio = Stats.of([p50 / cycle_s])
    return [
        time_row("embeddings: overhead p50 at concurrency 1 (gateway - direct)", Stats.of([p50])),
        ratio_row(
            "embeddings: overhead p50 / in-process reserve+settle cycle",
            ratio,
            f"<= {TARGET:.1f}",
            ratio.median <= TARGET,
            note=f"n={calls}; cycle {cycle_s * 1000:.2f} ms",
        ),
    ]
