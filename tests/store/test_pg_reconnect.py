"""Issue 20 item 8, R-DB-7: a PostgreSQL server restart under a running fleet.

The server drops every session (a restart, a failover): a `ledger worker run --loop` keeps
working (work queued after the restart is done, the loop does not exit 4, also when the server
stays down longer than the busy timeout), and a long-lived `Ledger`'s next call succeeds. The test
starts its OWN throw-away server (scripts/pg-test-server.sh) and really restarts it with `pg_ctl`;
the shared test server is never touched.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ledger.api import Ledger
from ledger.errors import DatabaseUnreachableError
from ledger.standin.server import Scripted, StandIn
from tests.support.backends import fresh_pg_database, rows
from tests.support.ledgers import TEST_CATALOG
from tests.support.procs import write_home
from tests.support.queue_setup import ROOT, STANDIN_ENV, cli_env, standin_home, worker_argv

SCRIPT = ROOT / "scripts" / "pg-test-server.sh"


def _pg_ctl() -> str | None:
    found = shutil.which("pg_ctl")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return candidates[-1] if candidates else None


@pytest.fixture
def private_pg() -> Iterator[tuple[str, Callable[..., None]]]:
    """A private PostgreSQL server: (URL of a fresh database on it, restart())."""
    pg_ctl = _pg_ctl()
    if pg_ctl is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the PostgreSQL restart test: pg_ctl is missing")
        pytest.skip("the PostgreSQL restart test needs pg_ctl (scripts/pg-test-server.sh)")
    base = Path(tempfile.mkdtemp(prefix="ledger-pgr-", dir="/tmp"))
    base.chmod(0o755)  # the server's user must reach its directory
    directory = base / "pg"  # the script owns and opens up this one for the server's user
    started = subprocess.run(["bash", str(SCRIPT), "start", str(directory)],
                             capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        server = started.stdout.strip().split("=", 1)[1].strip("'")
        admin = create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text('CREATE DATABASE "ledger_restart"'))
        admin.dispose()
        as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

        def ctl(*args: str) -> None:
            subprocess.run(
                [*as_owner, pg_ctl, "-D", str(directory / "data"), "-l",
                 str(directory / "server.log"), "-w", *args],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300,
            )

        def restart(down_s: float = 0.0) -> None:
            """Drop every session; with `down_s`, stay down that long before starting again."""
            if not down_s:
                ctl("-m", "fast", "restart")  # the options it was started with are kept
                return
            ctl("-m", "fast", "stop")
            time.sleep(down_s)
            ctl("-o", f"-c listen_addresses='' -c unix_socket_directories='{directory}'",
                "start")

        yield make_url(server).set(database="ledger_restart").render_as_string(False), restart
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(directory)], timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(base, ignore_errors=True)


def _state(url: str, source: str) -> str | None:
    found = rows(url, "SELECT state FROM sources WHERE id = :s", s=source)
    return str(found[0][0]) if found else None


def _wait_done(url: str, source: str, worker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while _state(url, source) != "done":
        assert worker.poll() is None, worker.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, f"{source} never done"
        time.sleep(0.1)


def test_issue20_8_r_db_7_worker_loop_and_ledger_survive_a_server_restart(
    tmp_path: Path, private_pg: tuple[str, Callable[..., None]]
) -> None:
    url, restart = private_pg
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        home = standin_home(tmp_path / "home", standin, busyTimeoutMs=1000)
        led = Ledger.open(home, url, env=STANDIN_ENV)  # long-lived: its pool outlives the restart
        led.add_source("before", "payload")
        worker = subprocess.Popen(
            worker_argv(home, "--loop", "--max-sleep", "0.2"), cwd=ROOT,
            env=cli_env(LEDGER_DB=url), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            _wait_done(url, "before", worker)
            restart()  # every session of the worker and of `led` is dropped
            assert led.add_source("after", "payload")  # the long-lived Ledger's first call
            _wait_done(url, "after", worker)  # the loop survived and took the new work
            res = led.reserve("direct", "p1/m1")
            assert res.id > 0
            restart(down_s=3.0)  # down longer than busyTimeoutMs: the loop polls on regardless
            assert led.add_source("later", "payload")
            _wait_done(url, "later", worker)
        finally:
            worker.send_signal(signal.SIGTERM)
            _out, err = worker.communicate(timeout=60)
            led.close()
    assert worker.returncode == 0, err.decode()[-2000:]
    assert _state(url, "before") == _state(url, "after") == _state(url, "later") == "done"


def _terminate(url: str, pid: int) -> None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    finally:
        engine.dispose()


def test_issue20_8_a_dropped_pooled_session_is_replaced_before_the_next_transaction(
    tmp_path: Path,
) -> None:
    """The server ends the session a long-lived `Ledger` keeps in its pool (idle timeout,
    failover, an administrator): its next write and read run on a new session."""
    with fresh_pg_database() as url:
        home = tmp_path / "h"
        write_home(home, TEST_CATALOG)
        led = Ledger.open(home, url, env={})
        try:
            with led.db.read() as conn:
                pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            _terminate(url, pid)
            assert led.reserve("s1", "alpha/small").id == 1
            with led.db.read() as conn:
                assert int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()) != pid
        finally:
            led.close()


def test_issue20_8_a_transaction_dropped_after_it_began_writing_is_never_retried(
    tmp_path: Path,
) -> None:
    """Once the caller's block runs, a dropped session is the caller's error (the transaction
    may have committed): the block runs once, the error is `unreachable`, nothing is stored."""
    with fresh_pg_database() as url:
        home = tmp_path / "h"
        write_home(home, TEST_CATALOG)
        led = Ledger.open(home, url, env={})
        runs: list[int] = []

        def dropped_midway() -> None:
            with led.db.write() as txn:
                runs.append(1)
                pid = int(txn.conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                _terminate(url, pid)
                txn.conn.execute(text("SELECT 1"))

        try:
            with pytest.raises(DatabaseUnreachableError):
                dropped_midway()
            assert runs == [1]
            assert led.reserve("s1", "alpha/small").id == 1  # and the ledger goes on
        finally:
            led.close()
