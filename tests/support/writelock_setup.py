"""The write lock held, queued and interrupted from outside (ledger/store/writelock.py): shared by
the write-lock tests and the ones that need a held lock (service, gateway key, simulate cleanup)."""

from __future__ import annotations

import fcntl
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ledger.api import Ledger
from ledger.store import sqlite_driver
from ledger.store.writelock import WriteLock, tickets
from tests.support.ledgers import TEST_CATALOG
from tests.support.procs import write_home

HOLD_LOCK_FILE = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"
)


@contextmanager
def lock_file_held(path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holds the write lock file until the block ends (or it is killed)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK_FILE, str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.communicate("", timeout=60)  # also reaps one that was killed


def free_now(path: Path) -> bool:
    """Whether a new file description gets the lock at once (nobody holds it)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def rows(home: Path) -> int:
    with sqlite_driver.connect(home / "ledger.db") as conn:
        return int(conn.execute("SELECT count(*) FROM reservations").fetchone()[0])


def ledger_home(tmp_path: Path, **policy: object) -> Path:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, **policy)
    Ledger.open(home, env={}).close()
    return home


def _ticket_count(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return tickets(fd)
    finally:
        os.close(fd)


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def stop_every_thread(pid: int) -> None:
    """SIGSTOP `pid` and return once every one of its threads is stopped.

    A group stop reaches a process's threads one after another: under CPU load a helper thread
    can still take a lock released just after `kill` returned, leaving a stopped *holder* (which
    is rightly `busy` for everyone) instead of a stopped writer in the queue."""
    os.kill(pid, signal.SIGSTOP)

    def all_stopped() -> bool:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            with suppress(OSError):  # a thread that just exited
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        return bool(states) and all(state in ("T", "t") for state in states)

    _wait_for(all_stopped)


def _more_tickets(path: Path, than: int) -> bool:
    return _ticket_count(path) > than


def _held_by_a_thread(path: Path) -> tuple[threading.Thread, threading.Event]:
    """A thread of this process holds the write lock (in the queue) until the event is set."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with WriteLock(path, 60_000).held():
            holding.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60)
    return holder, release


def _cli_reserve_in_the_queue(home: Path, source: str) -> subprocess.Popen[str]:
    """A `ledger reserve` process, returned once it has taken its place in the queue."""
    path = home / "ledger.db-writelock"
    before = _ticket_count(path)
    process = subprocess.Popen(
        [sys.executable, "-m", "ledger", "--home", str(home), "reserve", source,
         "--model", "alpha/small"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    _wait_for(functools.partial(_more_tickets, path, before))
    return process


@contextmanager
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, and a child started inside gets it by default, even
    when this run was started ignoring it (a script's `pytest &`: Python then keeps it ignored)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
