"""`ledger worker run --server` (R-SRV-7): workers drain the queue through one `ledger serve`,
calling the provider themselves; leases and budgets behave as with the library."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ledger.standin.server import Scripted, StandIn
from tests.support.queue_setup import (
    ROOT,
    assert_each_source_once,
    cli_env,
    db_rows,
    open_ledger,
    queued_home,
    standin_home,
    two_workers,
    worker_argv,
)
from tests.support.serving import running


def test_r_srv_7_two_workers_through_the_service_process_each_source_once(
    tmp_path: Path,
) -> None:
    log = tmp_path / "accepted.log"
    with StandIn(default=Scripted(text='{"ok": true}', delay_s=0.03)) as standin:
        home = queued_home(tmp_path / "home", standin, 12)
        env = cli_env(LEDGER_TEST_LOG=str(log))
        with running(home, env=env) as served:
            argv = worker_argv(
                home, "--once", "--handler", "tests.support.queue_setup:appending_handler",
                "--json",
                "--server", str(served.socket),
            )
            summaries = two_workers(argv, env)
    assert_each_source_once(home, log, standin, summaries, 12)


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


def test_r_srv_7_worker_takes_the_catalog_from_the_service(tmp_path: Path) -> None:
    """Issue 33: `worker run --server` in a state directory without catalog.json used to say
    "run ledger catalog init" (which would make a different local catalog): it takes the served
    ledger's catalog and drains the queue with it."""
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        home = queued_home(tmp_path / "home", standin, 2)
        worker_home = tmp_path / "worker"
        worker_home.mkdir(mode=0o700)
        (worker_home / "recovery.json").write_text((home / "recovery.json").read_text())
        env = cli_env()
        with running(home, env=env) as served:
            argv = worker_argv(worker_home, "--once", "--json", "--server", str(served.socket))
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=120,
                                  check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["done"] == 2
    assert not (worker_home / "catalog.json").exists()


def test_r_srv_7_worker_without_a_token_over_tcp_is_told_where_it_is(tmp_path: Path) -> None:
    """Issue 33: without $LEDGER_TOKEN over TCP the worker said only "a valid bearer token is
    required": it says where the token is (a path, never the token)."""
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        home = queued_home(tmp_path / "home", standin, 1)
        env = cli_env()
        env.pop("LEDGER_TOKEN", None)
        with running(home, "--listen", "127.0.0.1:0", env=env) as served:
            assert served.url is not None
            assert served.token is not None
            argv = worker_argv(home, "--once", "--server", served.url)
            refused = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                     timeout=120, check=False)
    assert refused.returncode == 2
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "LEDGER_TOKEN" in line
    assert str(home / "ledger.token") in line
    assert served.token not in line + refused.stdout
