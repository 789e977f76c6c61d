"""R-RT-5 with R-SRV-3: a real `ledger serve` and library processes share one round-robin cursor:
4 client processes through the service and 4 library processes, 50 reservations each, through a
4-candidate pool give 100 +- 1 per candidate."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from pathlib import Path

import pytest

from ledger.api import Ledger
from tests.support.procs import write_home
from tests.support.routing_fixtures import MEMBERS, routing_catalog
from tests.support.routing_procs import client_pool_racer, pool_racer
from tests.support.serving import running


@pytest.mark.slow
def test_r_rt_5_round_robin_is_exact_through_ledger_serve_and_the_library(
    tmp_path: Path,
) -> None:
    home = tmp_path / "state"
    write_home(home, routing_catalog(), callsPerHour=100_000, sourceCalls=100, sourceModels=10,
               pools={"p": {"candidates": MEMBERS, "strategy": "round-robin"}})  # fmt: skip
    Ledger.open(home, env={}).close()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(8)
    out = ctx.Queue()
    with running(home) as served:
        procs = [
            ctx.Process(target=client_pool_racer,
                        args=(str(served.socket), barrier, t, 50, "pool/p", out))
            for t in range(4)
        ] + [
            ctx.Process(target=pool_racer, args=(str(home), barrier, 10 + t, 50, "pool/p", out))
            for t in range(4)
        ]  # fmt: skip
        for proc in procs:
            proc.start()
        reports = [out.get(timeout=300) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
    assert [e for r in reports for e in r["errors"]] == []
    granted = Counter(model for r in reports for _rid, model in r["granted"])
    assert sum(granted.values()) == 400
    assert all(abs(granted[m] - 100) <= 1 for m in MEMBERS), granted
