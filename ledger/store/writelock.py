"""A blocking write lock in a file beside the SQLite database: writers wait in the kernel, in turn.

Invariant: this lock only orders writers so none sleeps while the database is free (SQLite's busy
handler sleeps in growing steps and lets newcomers overtake); SQLite's own locking stays the
correctness guarantee. Where no lock file can be used (`:memory:`, URI databases, a directory we
may not write and no lock file yet, a symlink or other non-regular file in its place) the lock
degrades to nothing and SQLite's busy timeout alone decides, as before.

Each acquisition opens its own file description and takes `flock(LOCK_EX)` on it, so threads of
one process contend like processes do, and the kernel drops the lock of a process that dies. A
contended wait blocks in a helper thread while the caller waits on an Event with the busy timeout
(no polling); a waiter given up on releases the lock itself if it ever gets it.

Busy means *held*, not *queued*: every holder bumps a turn counter in the lock file, and a waiter
gives up only when a whole busy timeout passes without the lock changing hands. A long queue that
keeps moving (a burst of cron jobs on a starved CPU) never fails; a stuck holder still does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from ledger.errors import BusyError
from ledger.home import sqlite_file

LOCK_SUFFIX = "-writelock"
_OPEN_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang open

# Descriptors of this process's lock files (held or awaited): closed in a forked child, which
# must not keep the parent's lock alive nor hand it to itself.
_OPEN_FDS: set[int] = set()
_FDS_GUARD = threading.Lock()


def lock_path(url: str) -> Path | None:
    """The lock file for a database URL, or None where SQLite's own locking must do."""
    path = sqlite_file(url)
    return None if path is None else path.with_name(path.name + LOCK_SUFFIX)


def _open(path: Path) -> int | None:
    """A new descriptor on the lock file (created 0600), or None when it cannot be used."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o600)
    except OSError:
        try:  # a read-only directory or file: flock works on a read-only descriptor too
            fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        except OSError:
            return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    with _FDS_GUARD:
        _OPEN_FDS.add(fd)
    return fd


def _close(fd: int) -> None:
    """Close a lock descriptor (which releases the lock) unless a fork already closed it."""
    with _FDS_GUARD:
        if fd not in _OPEN_FDS:
            return
        _OPEN_FDS.discard(fd)
    os.close(fd)


def _forget_in_child() -> None:
    global _FDS_GUARD
    _FDS_GUARD = threading.Lock()  # a thread of the parent may have held it at fork time
    for fd in list(_OPEN_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _OPEN_FDS.clear()


os.register_at_fork(after_in_child=_forget_in_child)


class _Waiter:
    """A helper thread blocked in flock; whoever loses the race (caller or thread) releases."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.granted = threading.Event()
        self.failed = False
        self.abandoned = False
        self.mutex = threading.Lock()
        threading.Thread(target=self._run, name="ledger-writelock", daemon=True).start()

    def _run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            self.failed = True
        with self.mutex:
            if self.abandoned:
                _close(self.fd)
                return
            self.granted.set()

    def wait(self, timeout_s: float) -> bool:
        """True once the lock is ours (the caller then owns `fd`); False once it has not changed
        hands for `timeout_s`."""
        seen = turns(self.fd)
        try:
            while not self.granted.wait(timeout_s):
                now = turns(self.fd)
                if now == seen:  # nobody got the lock for a whole timeout: it is truly held
                    break
                seen = now
        except BaseException:  # KeyboardInterrupt or another signal raised while waiting
            self._give_up()
            raise
        with self.mutex:
            if self.granted.is_set():
                return True
            self.abandoned = True  # the thread closes the descriptor once it gets the lock
            return False

    def _give_up(self) -> None:
        with self.mutex:
            if self.granted.is_set():
                _close(self.fd)  # granted just as we were interrupted: release at once
            else:
                self.abandoned = True


class WriteLock:
    """The write lock of one database (a no-op where `path` is None)."""

    def __init__(self, path: Path | None, timeout_ms: int) -> None:
        self.path = path
        self.timeout_s = timeout_ms / 1000

    @contextlib.contextmanager
    def held(self) -> Iterator[bool]:
        """Hold the lock for the block; yields False when degraded to SQLite's locking alone.

        Raises BusyError when another writer holds it past the busy timeout.
        """
        fd = None if self.path is None else _open(self.path)
        if fd is None:
            yield False
            return
        owner = os.getpid()
        try:
            locked = _try_lock(fd)
            if locked is None:  # held elsewhere: wait in turn
                waiter = _Waiter(fd)
                fd = None  # the helper thread owns the descriptor until it is granted
                if not waiter.wait(self.timeout_s):
                    raise BusyError()
                fd = waiter.fd
                locked = not waiter.failed
            if locked:
                take_turn(fd)
            yield locked
        finally:
            if fd is not None and os.getpid() == owner:
                _close(fd)


_TURN = 8  # bytes of the little-endian turn counter at the start of the lock file


def turns(fd: int) -> int:
    """How many times the lock has been taken (readable without holding it)."""
    try:
        return int.from_bytes(os.pread(fd, _TURN, 0), "little")
    except OSError:
        return 0


def take_turn(fd: int) -> None:
    """Count one more turn; only the holder calls it (a read-only descriptor just skips it)."""
    with contextlib.suppress(OSError):
        os.pwrite(fd, ((turns(fd) + 1) % 2**64).to_bytes(_TURN, "little"), 0)


def _try_lock(fd: int) -> bool | None:
    """True when taken at once, None when held elsewhere, False when flock is unsupported."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    except OSError:
        return False
    return True
