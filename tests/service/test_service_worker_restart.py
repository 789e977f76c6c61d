"""Issue 29 item 9, R-SRV-7: `ledger worker run --server SOCK --loop` survives `ledger serve`
restarts (a policy change, systemd `Restart=`), mid-drain and idle, as it survives a database
server restart: one line on stderr, a wait with backoff, and it goes on (sources added
meanwhile get drained). `--once` against a service that is not there still exits 4. Real
`ledger serve` and worker processes, on SQLite and PostgreSQL."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ledger.api import Ledger
from ledger.client import NOT_SERVED
from ledger.errors import ServiceUnreachableError
from ledger.standin.server import Scripted, StandIn
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.queue_setup import ROOT, STANDIN_ENV, cli_env, standin_home, worker_argv
from tests.support.serving import Served, start

pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)

UNREACHABLE_LINE = (
    f"warning: {ServiceUnreachableError()}; waiting with backoff and going on when it answers"
)


def _done(url: str) -> int:
    return int(rows(url, "SELECT count(*) FROM sources WHERE state = 'done'")[0][0])


def _wait(what: Callable[[], bool], worker: subprocess.Popen[bytes], label: str) -> None:
    deadline = time.monotonic() + 180
    while not what():
        assert worker.poll() is None, worker.communicate()[1].decode()[-3000:]
        assert time.monotonic() < deadline, label
        time.sleep(0.05)


def test_issue29_9_worker_loop_through_the_service_survives_restarts_mid_drain_and_idle(
    tmp_path: Path, ledger_db: str | None
) -> None:
    with StandIn(default=Scripted(text='{"ok": true}', delay_s=0.05)) as standin:
        home = standin_home(tmp_path / "home", standin, busyTimeoutMs=2000, callsPerHour=1000)
        url = db_url(home, ledger_db)
        led = Ledger.open(home, ledger_db or str(home / "ledger.db"), env=STANDIN_ENV)
        for n in range(40):
            led.add_source(f"s{n:02}", "payload")
        env = cli_env()
        served: Served = start(home, db=ledger_db, env=env)
        worker = subprocess.Popen(
            worker_argv(home, "--loop", "--max-sleep", "0.2", "--server", str(served.socket)),
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            _wait(lambda: _done(url) >= 3, worker, "the drain never started")
            assert served.stop() == 0  # mid-drain: SIGTERM, and at once a new service
            served = start(home, db=ledger_db, env=env)
            _wait(lambda: _done(url) == 40, worker, "the drain did not go on after the restart")
            assert served.stop() == 0  # idle, and down longer than the client's reconnect wait
            for n in range(5):
                assert led.add_source(f"later{n}", "payload")  # queued while it is down
            time.sleep(5)
            assert worker.poll() is None  # still waiting, not exited 4
            served = start(home, db=ledger_db, env=env)
            _wait(lambda: _done(url) == 45, worker, "sources added meanwhile were not drained")
        finally:
            worker.send_signal(signal.SIGTERM)
            _out, err = worker.communicate(timeout=120)
            served.stop()
            led.close()
    text = err.decode()
    assert worker.returncode == 0, text[-3000:]
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.strip()]
    # one line per outage the loop had to wait out (the idle one at least), nothing else
    assert set(lines) == {UNREACHABLE_LINE}, text[-3000:]
    assert 1 <= len(lines) <= 2
    assert rows(url, "SELECT count(*) FROM sources WHERE state != 'done'") == [(0,)]


def test_issue29_9_the_client_knows_the_services_not_served_answers(ledger_db: str | None) -> None:
    from ledger.service.errors import MESSAGES

    assert MESSAGES[503] in NOT_SERVED  # what a draining service answers before reading


def test_issue29_9_worker_once_against_a_service_that_is_not_there_exits_4(
    tmp_path: Path, ledger_db: str | None
) -> None:
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        home = standin_home(tmp_path / "home", standin)
        argv = worker_argv(home, "--once", "--server", str(home / "ledger.sock"))
        done = subprocess.run(argv, cwd=ROOT, env=cli_env(), capture_output=True, timeout=120)
    assert done.returncode == 4
    assert done.stderr.decode().strip().splitlines() == [f"ledger: {ServiceUnreachableError()}"]
