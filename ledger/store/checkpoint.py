"""WAL checkpoints off the reserve path, and a log that starts over (R-DB-3, issue 46 item 2).

In WAL mode every commit appends pages to `ledger.db-wal`; a checkpoint copies them back into the
database file, and the log starts over from its beginning only when every frame has been copied
and no reader still reads from the log. SQLite's own arrangement (the committing writer copies
the log once it holds 1,000 pages) puts a whole checkpoint inside one reserve, and a reader that
builds the status document back to back always holds a snapshot older than the last commit, so
the copy never completes and the log grows without bound. Here:

- *Copying* runs on a thread of its own (`Checkpointer`) in every process that writes: after
  every `COPY_EVERY` commits it runs a PASSIVE checkpoint on its own connection. A PASSIVE
  checkpoint takes no lock a writer needs (only SQLite's checkpoint lock, which one process at a
  time holds; another process's attempt meanwhile returns at once), so no reserve waits on it.
- *Starting over* needs one moment with no commit between the last copy and the next write, and
  no reader on the log. Once the log holds `RESTART_FRAMES` frames and a checkpoint found no
  reader holding it back, the checkpointer takes the write lock in turn (`ledger.db-writelock`,
  like a writer) for one more PASSIVE checkpoint of the few frames committed since, and lets it
  go: the next writer finds everything copied and starts the log over (SQLite does that itself
  when no reader reads from the log). A reserve queued meanwhile waits for the copy of those few
  frames only, never for a reader.
- *Long readers* (the status document) start their snapshot at such a moment (`restart_point`):
  when the log is long, before its snapshot begins the reader copies the log (PASSIVE, no lock),
  then, holding the write lock in turn, copies the rest and begins its snapshot on the fully
  copied log, so it reads the database file alone and never holds the restart back; it lets the
  lock go at once and reads for as long as it needs. A reader that reads back to back thus leaves
  the log free to start over once per read, without a gap of its own.
- Writers keep SQLite's own automatic checkpoint as the fallback, for a process with no thread
  (a one-shot command) and nobody else checkpointing; `journal_size_limit` trims the file back
  after a log that once grew long (a reader outside the ledger held it) has started over.

Invariants: a checkpoint never waits on a reader or a writer (PASSIVE only, never RESTART or
TRUNCATE with a busy handler); the write lock is held only for the copy of frames committed since
the last copy; every connection that checkpoints runs `synchronous=FULL` (the database file is
synced before the log may start over); a failed checkpoint is never an error of the caller.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError
from ledger.store import sqlite_driver
from ledger.store.writelock import WriteLock

COPY_EVERY = int(os.environ.get("LEDGER_CKPT_COPY_EVERY", "32"))
"""Commits between two background copies."""
RESTART_FRAMES = int(os.environ.get("LEDGER_CKPT_RESTART_FRAMES", "256"))
"""Frames in the log (about 1 MiB at 4 KiB pages) past which the log is due to start over."""
FALLBACK_FRAMES = int(os.environ.get("LEDGER_CKPT_FALLBACK_FRAMES", "2048"))
"""Writers' own automatic checkpoint (SQLite's default), for when nobody else copies."""
JOURNAL_SIZE_LIMIT = int(os.environ.get("LEDGER_CKPT_SIZE_LIMIT", str(8 * 1024 * 1024)))
"""Bytes the -wal file is trimmed back to after it starts over."""
CAUGHT_UP = 16
"""Frames committed meanwhile below which a copy outside the lock is close enough."""
PASSES = 3
"""Copies outside the lock at most, before the one under it."""
LOCK_WAIT_MS = 250
"""How long a checkpoint waits for its turn on the write lock before giving up this time."""
_MODE = os.environ.get("LEDGER_CKPT_MODE", "all")  # experiment switch: all|nothread|noassist|off
_DEBUG = os.environ.get("LEDGER_CKPT_DEBUG")


def _dbg(*parts: object) -> None:  # experiment only
    if _DEBUG:
        import time as _t
        with open(_DEBUG, "a") as fh:
            fh.write(f"{_t.monotonic():.4f} {os.getpid()} " + " ".join(map(str, parts)) + "\n")


def writer_pragmas() -> list[str]:
    """PRAGMAs for every ledger connection in WAL mode."""
    if _MODE == "off":
        return []
    return [
        f"PRAGMA wal_autocheckpoint = {int(FALLBACK_FRAMES)}",
        f"PRAGMA journal_size_limit = {int(JOURNAL_SIZE_LIMIT)}",
    ]


def passive(conn: Any) -> tuple[int, int, int]:
    """One PASSIVE checkpoint: (busy, frames in the log, frames copied); never waits."""
    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    if not row:
        return 1, -1, -1
    return int(row[0]), int(row[1]), int(row[2])


def catch_up(conn: Any) -> tuple[int, int, int]:
    """PASSIVE checkpoints until one finds fewer than `CAUGHT_UP` new frames to copy (so the
    copy under the write lock that may follow is short), at most `PASSES`; the last result."""
    result = passive(conn)
    for _ in range(PASSES - 1):
        busy, log, done = result
        if busy or done < log:  # held back (a reader, or another checkpoint): no use going on
            break
        again = passive(conn)
        fresh = again[1] - log if again[1] >= log else again[1]  # the log may have started over
        result = again
        if fresh < CAUGHT_UP:
            break
    return result


def _complete(result: tuple[int, int, int]) -> bool:
    busy, log, done = result
    return not busy and log >= 0 and done == log


class Checkpointer:
    """The checkpoints of one SQLite file in WAL mode, for the processes that use it."""

    def __init__(self, path: Path, write_lock: WriteLock, busy_timeout_ms: int) -> None:
        self.path = path
        self.write_lock = write_lock
        self.lock_wait = WriteLock(write_lock.path, min(busy_timeout_ms, LOCK_WAIT_MS))
        self.busy_timeout_ms = busy_timeout_ms
        self._commits = 0
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._guard = threading.Lock()
        self.copies = 0  # checkpoints run by the thread (tests, bench)
        self.restarts_helped = 0  # times the write lock was taken for the last few frames

    # --- writers: the background copy -------------------------------------------------------

    def committed(self) -> None:
        """A write transaction of this process committed (cheap: a counter, now and then a wake)."""
        if _MODE in ("off", "nothread"):
            return
        self._commits += 1
        if self._commits < COPY_EVERY:
            return
        self._commits = 0
        if self._thread is None or self._pid != os.getpid():
            self._start()
        self._wake.set()

    def _start(self) -> None:
        with self._guard:
            if self._closed:
                return
            if self._thread is not None and self._pid == os.getpid():
                return
            self._pid = os.getpid()  # a forked child starts its own thread
            self._wake = threading.Event()
            self._thread = threading.Thread(
                target=self._run, name="ledger-checkpoint", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        conn = None
        try:
            conn = self._connect()
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._closed:
                    return
                self.copy(conn)
        except Exception:  # noqa: BLE001 - the fallback (writers' own checkpoint) remains
            return
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def _connect(self) -> Any:
        conn = sqlite_driver.connect(str(self.path), isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        conn.execute(f"PRAGMA journal_size_limit = {int(JOURNAL_SIZE_LIMIT)}")
        return conn

    def copy(self, conn: Any) -> None:
        """Copy what the log holds; past `RESTART_FRAMES`, with nobody holding the copy back,
        copy the last few frames under the write lock so the next writer starts the log over."""
        result = catch_up(conn)
        self.copies += 1
        _dbg("bg", result)
        if result[1] < RESTART_FRAMES or not _complete(result):
            return
        with self._turn() as held:
            if held:
                r2 = passive(conn)
                self.restarts_helped += 1
                _dbg("bg-locked", r2)
            else:
                _dbg("bg-nolock")

    @contextlib.contextmanager
    def _turn(self) -> Iterator[bool]:
        """The write lock in turn for a moment, or False (no lock file, or not in time)."""
        if self.write_lock.path is None:
            yield False
            return
        try:
            with self.lock_wait.held() as held:
                yield held
        except LedgerError:  # busy: another writer holds it long; try again another time
            yield False

    # --- long readers ----------------------------------------------------------------------

    @contextlib.contextmanager
    def restart_point(self, raw: Any) -> Iterator[None]:
        """Around the start of a long read's snapshot on `raw` (no transaction open yet): when
        the log is long, copy it and begin the snapshot with the write lock held, on a log fully
        copied, so this read never holds the log's restart back."""
        if _MODE in ("off", "noassist"):
            yield
            return
        try:
            result = catch_up(raw)
        except sqlite_driver.Error:
            result = (1, -1, -1)
        _dbg("rd", result)
        if result[1] < RESTART_FRAMES or not _complete(result):
            yield
            return
        with self._turn() as held:
            if held:
                with contextlib.suppress(sqlite_driver.Error):
                    _dbg("rd-locked", passive(raw))
                self.restarts_helped += 1
            else:
                _dbg("rd-nolock")
            yield  # the caller begins its snapshot here, then the lock is let go

    def close(self) -> None:
        """Stop the thread (its connection closes with it)."""
        with self._guard:
            self._closed = True
            thread = self._thread if self._pid == os.getpid() else None
        self._wake.set()
        if thread is not None:
            thread.join(5)
