"""`ledger worker run --server` (R-SRV-7): workers drain the queue through one `ledger serve`,
calling the provider themselves; leases and budgets behave as with the library."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

from ledger.standin import Scripted, StandIn
from tests.serving import running
from tests.test_queue import (
    ROOT,
    cli_env,
    db_rows,
    open_ledger,
    standin_home,
    worker_argv,
)


def test_r_srv_7_two_workers_through_the_service_process_each_source_once(
    tmp_path: Path,
) -> None:
    log = tmp_path / "accepted.log"
    with StandIn(default=Scripted(text='{"ok": true}', delay_s=0.03)) as standin:
        home = standin_home(tmp_path / "home", standin)
        led = open_ledger(home)
        for n in range(12):
            led.add_source(f"src-{n:02d}", f"payload {n}")
        led.close()
        env = cli_env(LEDGER_TEST_LOG=str(log))
        with running(home, env=env) as served:
            argv = worker_argv(
                home, "--once", "--handler", "tests.test_queue:appending_handler", "--json",
                "--server", str(served.socket),
            )
            procs = [
                subprocess.Popen([*argv, "--worker-id", f"w{i}"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for i in range(2)
            ]
            outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    summaries = [json.loads(out) for out, _ in outputs]
    assert sum(s["done"] for s in summaries) == 12
    assert Counter(log.read_text().split()) == Counter({f"src-{n:02d}": 1 for n in range(12)})
    per_source = db_rows(home, "SELECT source_id, count(*) FROM reservations GROUP BY source_id")
    assert sorted(per_source) == [(f"src-{n:02d}", 1) for n in range(12)]
    assert db_rows(home, "SELECT count(*) FROM sources WHERE state = 'done'") == [(12,)]
    assert len(standin.requests) == 12


def test_r_srv_7_worker_budget_refusals_through_the_service_exit_3(tmp_path: Path) -> None:
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        home = standin_home(tmp_path / "home", standin, callsPerHour=2)
        led = open_ledger(home)
        for n in range(4):
            led.add_source(f"s{n}", "p")
        led.close()
        env = cli_env()
        with running(home, env=env) as served:
            argv = worker_argv(home, "--once", "--json", "--server", str(served.socket))
            first = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=120,
                                   check=False)
            second = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=120,
                                    check=False)
    assert first.returncode == 0, first.stderr.decode()
    assert json.loads(first.stdout)["done"] == 2
    assert second.returncode == 3  # everything due was refused by the shared hourly budget
    assert db_rows(home, "SELECT count(*) FROM reservations") == [(2,)]
