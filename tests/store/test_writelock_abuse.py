"""Issue 20 items 5 and 6, R-DB-3: the write lock under abuse (ledger/store/writelock.py).

A writer stopped (SIGSTOP) in the queue, a lock file truncated under waiting writers: a waiter is
still bounded by the busy timeout (or goes around the stalled writer), and a long-lived process
writing behind a stopped writer keeps a constant number of threads and descriptors. Real `ledger`
processes are stopped; budgets stay exact once they are continued.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ledger.api import Ledger
from ledger.errors import BusyError
from ledger.records import Success
from ledger.store import sqlite_driver, writelock
from ledger.store.writelock import WriteLock, tickets, turns
from tests.support.writelock_setup import (
    _cli_reserve_in_the_queue,
    _held_by_a_thread,
    free_now,
    ledger_home,
    lock_file_held,
    rows,
    stop_every_thread,
)


def _reserve(home: Path, source: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "reserve", source,
         "--model", "alpha/small"], capture_output=True, text=True, timeout=timeout_s,
    )


def _stopped_writer_in_the_queue(home: Path) -> subprocess.Popen[str]:
    """A `ledger reserve` that took its place behind a holder, then was stopped (SIGSTOP); the
    holder has left since, so the stopped writer is next in turn and stays so."""
    path = home / "ledger.db-writelock"
    holder, release = _held_by_a_thread(path)
    stopped = _cli_reserve_in_the_queue(home, "stopped")
    time.sleep(0.3)  # past taking its ticket: it now waits for the holder's
    stop_every_thread(stopped.pid)
    release.set()
    holder.join(60)
    return stopped


def _continue(stopped: subprocess.Popen[str], home: Path) -> None:
    """Continue the stopped writer (source `stopped`): it writes its reservation once.

    A writer stopped for longer than its busy timeout may also end `busy` once continued (exit
    4, as a full CI run saw once and no rerun reproduced): then it must have written nothing,
    and the retry its message asks for writes it once. Either way the ledger stays exact."""
    os.kill(stopped.pid, signal.SIGCONT)
    _out, err = stopped.communicate(timeout=60)
    if stopped.returncode == 4:
        assert "database busy" in err, err
        assert not _reserved(home, "stopped")  # nothing written
        retried = _reserve(home, "stopped", timeout_s=60)
        assert retried.returncode == 0, retried.stderr
        return
    assert stopped.returncode == 0, err


def _reserved(home: Path, source: str) -> bool:
    with contextlib.closing(sqlite_driver.connect(home / "ledger.db")) as conn:
        found = conn.execute("SELECT 1 FROM reservations WHERE source_id = ?", (source,))
        return found.fetchone() is not None


def test_issue20_5_r_db_3_truncated_lock_file_never_hangs_a_writer(tmp_path: Path) -> None:
    """The lock file is truncated while a stopped writer waits in the queue: the ticket counter
    restarts and new writers draw tickets the stopped one still holds. Each must still finish
    within its busy timeout (here by going around the stalled writer), never block for good."""
    home = ledger_home(tmp_path, busyTimeoutMs=2000)
    stopped = _stopped_writer_in_the_queue(home)
    try:
        os.truncate(home / "ledger.db-writelock", 0)  # the counters start again at 0
        for index in range(3):
            started = time.monotonic()
            result = _reserve(home, f"after{index}", timeout_s=20)
            assert result.returncode == 0, result.stderr
            assert time.monotonic() - started < 15  # bounded (was: blocked for good)
        assert stopped.poll() is None  # passed, not waited for
    finally:
        _continue(stopped, home)
    assert rows(home) == 4  # exact: every write once, the stopped one included


def _threads_and_descriptors() -> tuple[int, int]:
    return threading.active_count(), len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_issue20_6_r_db_3_no_thread_or_descriptor_leak_behind_a_stopped_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived process (a `worker run --loop`) writes 1,000 times while a stopped writer
    sits next in the queue: every write goes around it, and the process holds as many threads
    and descriptors after the 1,000th write as after the 80th (was: one more of each per write,
    until writes failed)."""
    monkeypatch.setattr(writelock, "_STALL_S", 0.005)  # the stall pass, faster: same logic
    home = ledger_home(tmp_path, callsPerHour=100_000)
    stopped = _stopped_writer_in_the_queue(home)
    led = Ledger.open(home, env={})
    try:
        counts = []
        for index in range(500):  # a reserve and a settle: 1,000 writes
            res = led.reserve(f"s{index}", "alpha/small")
            led.settle(res.id, Success(input_tokens=1, output_tokens=1))
            if index in (40, 499):  # after 80 writes: the WAL copy thread is up (checkpoint.py)
                counts.append(_threads_and_descriptors())
        assert counts[1] == counts[0], counts
        assert stopped.poll() is None  # still stopped throughout
    finally:
        _continue(stopped, home)
        led.close()
    assert rows(home) == 501
    for thread in [t for t in threading.enumerate() if t.name == "ledger-writelock"]:
        thread.join(60)  # the queue moved on once the stopped writer went: nothing left waiting
        assert not thread.is_alive()
    assert free_now(home / "ledger.db-writelock")


def test_issue20_6_a_place_in_a_replaced_lock_file_is_not_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock file is deleted and created anew while this process waits behind a stopped
    writer in the old one: its next write queues on the new file (where the others are), not
    in its old place on the deleted one."""
    monkeypatch.setattr(writelock, "_STALL_S", 0.005)
    home = ledger_home(tmp_path)
    path = home / "ledger.db-writelock"
    stopped = _stopped_writer_in_the_queue(home)
    led = Ledger.open(home, env={})
    try:
        led.reserve("s0", "alpha/small")  # goes around the stopped writer, its place left
        path.unlink()
        led.reserve("s1", "alpha/small")
        fd = os.open(path, os.O_RDONLY)
        try:
            assert (tickets(fd), turns(fd)) == (1, 1)  # it queued and wrote in the new file
        finally:
            os.close(fd)
    finally:
        _continue(stopped, home)
        led.close()
    assert rows(home) == 3


def test_issue20_6_busy_writes_behind_a_held_lock_leave_no_thread_behind(tmp_path: Path) -> None:
    """Another process holds the lock file for good (a writer stopped while holding it): every
    write of this process ends `busy`, and each takes over the wait the last one gave up rather
    than leave one more thread and descriptor blocked in the kernel."""
    path = tmp_path / "b.db-writelock"
    path.touch(mode=0o600)
    with lock_file_held(path):
        counts = []
        for attempt in range(30):
            with pytest.raises(BusyError), WriteLock(path, 20).held():
                pass
            if attempt in (2, 29):
                counts.append(_threads_and_descriptors())
        assert counts[1] == counts[0], counts
    for thread in [t for t in threading.enumerate() if t.name == "ledger-writelock"]:
        thread.join(60)  # the holder left: the one waiter got through and let go at once
    assert free_now(path)


def _burn_cpu() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_issue29_10_r_db_3_a_stopped_queued_writer_is_passed_over_once_for_everyone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `ledger reserve` stopped (Ctrl-Z) in the queue behind a short holder, CPU load beside:
    a long-lived process's writes go around the stopped writer once, not once per write (each
    pass costs two looks `_STALL_S` apart: ~200 ms a write, 100x an uncontended one), and none
    is ever busy; a CLI process writing afterwards gets through as well."""
    home = ledger_home(tmp_path, callsPerHour=100_000, busyTimeoutMs=5000)
    looks: list[bool] = []
    real_flock_now = writelock._flock_now

    def counted(path: Path) -> int | None:
        fd = real_flock_now(path)
        looks.append(fd is not None)  # a look at a free flock happens only in a stall pass
        return fd

    monkeypatch.setattr(writelock, "_flock_now", counted)
    burners = [_burn_cpu() for _ in range(2)]
    stopped = _stopped_writer_in_the_queue(home)
    led = Ledger.open(home, env={})
    try:
        for index in range(30):  # a reserve and a settle: 60 writes
            res = led.reserve(f"s{index}", "alpha/small")
            led.settle(res.id, Success(input_tokens=1, output_tokens=1))
        assert looks.count(True) <= 2, looks  # one stall pass (two free looks), not 60
        other = _reserve(home, "cli", timeout_s=60)  # another process, queued after the pass
        assert other.returncode == 0, other.stderr
        assert stopped.poll() is None  # passed over, not waited for
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        _continue(stopped, home)
        led.close()
    assert rows(home) == 32  # exact: every write once, the stopped one included
