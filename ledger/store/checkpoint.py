"""WAL checkpoints off the reserve path, and a log that starts over (R-DB-3, issue 46 item 2).

In WAL mode every commit appends pages to `ledger.db-wal`; a checkpoint copies them back into the
database file, and the log starts over from its beginning only once every frame is copied and no
reader still reads from the log. Left to SQLite, the committing writer copies the log when it
holds 1,000 pages (that reserve pays for the whole copy), and a reader that builds the status
document back to back always holds a snapshot older than the last commit: the copy never
completes, and the log grows without bound. Here:

- *Copying* runs on a thread of its own in every process that writes (`Checkpointer`): every
  `COPY_EVERY` commits it runs a PASSIVE checkpoint on its own connection. A PASSIVE checkpoint
  takes no lock a writer needs (only SQLite's checkpoint lock, held by one process at a time;
  another's attempt meanwhile returns at once) and waits for nobody, so no reserve waits on it.
  The thread never takes the ledger's write lock. With no reader on the log, a copy that ends
  between two commits leaves every frame copied, and the next writer starts the log over (SQLite
  does that itself when nobody reads from the log).
- *Long reads* (the status document) begin their snapshot where the log can start over
  (`restart_point`): when the log holds `RESTART_FRAMES` frames, the reader first copies it (no
  lock), then, holding the write lock in turn (`ledger.db-writelock`, like a writer), copies the
  few frames committed since and begins its snapshot on the fully copied log. That snapshot
  reads the database file alone, so the next writer starts the log over while the read goes on,
  for as long as it needs, without the lock. A reader that reads back to back thus lets the log
  start over at every read, though it never leaves a gap. A reserve queued behind it waits for
  the copy of a few frames, never for a reader.
- Writers keep SQLite's automatic checkpoint as a fallback, at `FALLBACK_FRAMES` (a one-shot
  command never runs the thread for long), and `journal_size_limit` trims the file back to
  `SIZE_LIMIT` once a log that grew long (a reader outside the ledger held it) starts over.

What no checkpoint can do: copy a frame committed after a snapshot that is still being read. The
log therefore always holds what is committed while the longest read runs; bounded reads keep it
bounded (status reads its scans of the 24 h window in snapshots of their own).

Invariants: a checkpoint never waits for a reader or a writer (PASSIVE only; no RESTART or
TRUNCATE, whose busy handler would hold writers back while readers finish); the write lock is
taken only by a long read on a long log, to copy frames committed since its own copy and begin
its snapshot; every connection that checkpoints runs `synchronous=FULL` (the database file is
synced before the log may start over); a failed checkpoint is never the caller's error.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError
from ledger.store import sqlite_driver
from ledger.store.writelock import WriteLock

COPY_EVERY = 32
"""Commits of this process between two background copies (about 300 frames for a ledger's cycle
of a reserve and a settle)."""
RESTART_FRAMES = 256
"""Frames in the log (1 MiB at 4 KiB pages) from which it is due to start over."""
CAUGHT_UP = 16
"""A copy outside the lock that found fewer new frames than this is close enough."""
PASSES = 3
"""Copies outside the lock at most, before the one under it."""
FALLBACK_FRAMES = 2048
"""Writers' own automatic checkpoint (8 MiB of log): only when nobody else copied."""
SIZE_LIMIT = 8 * 1024 * 1024
"""Bytes the -wal file is trimmed back to when it starts over (`journal_size_limit`)."""
BUSY_TRIES = 5
BUSY_PAUSE_S = 0.002
"""A long read finding another copy under way tries again this often, this long apart."""
FREE_TRIES = 4
"""Copies a long read makes, each followed by a look for the write lock free, before it waits
for its turn on the lock and copies under it (where no writer is mid-commit)."""
LOCK_WAIT_MS = 250
"""A checkpoint's turn on the write lock: given up when the lock does not change hands this long."""
_TOUCH = "SELECT count(*) FROM sqlite_master"  # opens the log and its index (no checkpoint)


def connection_pragmas() -> tuple[str, ...]:
    """PRAGMAs for every ledger connection to a database in WAL mode."""
    return (
        f"PRAGMA wal_autocheckpoint = {FALLBACK_FRAMES}",
        f"PRAGMA journal_size_limit = {SIZE_LIMIT}",
    )


Result = tuple[int, int, int]
"""A checkpoint's answer: (busy, frames in the log, frames copied); -1 frames: not WAL."""


def passive(conn: Any) -> Result:
    """One PASSIVE checkpoint on a DB-API connection outside a transaction; never waits."""
    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    if not row:  # pragma: no cover - SQLite always answers one row
        return 1, -1, -1
    return int(row[0]), int(row[1]), int(row[2])


def copied(result: Result) -> bool:
    """Every frame of the log is in the database file (nothing held the copy back)."""
    busy, log, done = result
    return not busy and log >= 0 and done == log


def log_index(path: Path) -> tuple[int, int] | None:
    """(frames in the log, frames copied) as the log's index says (the -shm file's header:
    `mxFrame` at byte 16, `nBackfill` at byte 96, in the machine's byte order; a format SQLite
    documents and keeps), or None without one. A plain file read, no lock: a hint for when a
    checkpoint is worth trying, never a reason to trust a frame."""
    try:
        fd = os.open(f"{path}-shm", os.O_RDONLY)
    except OSError:
        return None
    try:
        header = os.pread(fd, 100, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(header) < 100:
        return None
    (frames,) = struct.unpack_from("=I", header, 16)
    (done,) = struct.unpack_from("=I", header, 96)
    return frames, done


def _all_copied(path: Path) -> bool:
    index = log_index(path)
    return index is not None and index[1] >= index[0]


def catch_up(conn: Any) -> Result:
    """PASSIVE checkpoints until one finds fewer than `CAUGHT_UP` frames new since the one
    before (so a copy under the write lock after it is short), `PASSES` at most."""
    result = passive(conn)
    for _ in range(PASSES - 1):
        if not copied(result):  # held back (a reader, another checkpoint): no use going on
            break
        again = passive(conn)
        fresh = again[1] - result[1] if again[1] >= result[1] else again[1]  # started over
        result = again
        if fresh < CAUGHT_UP:
            break
    return result


class Checkpointer:
    """The checkpoints of one SQLite file in WAL mode, for one process (see the module doc)."""

    def __init__(self, path: Path, write_lock: WriteLock, busy_timeout_ms: int) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.lock = WriteLock(write_lock.path, min(busy_timeout_ms, LOCK_WAIT_MS))
        self.copies = 0  # background copies run (tests, bench)
        self.restarts = 0  # long reads begun on a log fully copied under the write lock
        self._closed = False
        self._reset()

    def _reset(self) -> None:
        """Fresh per-process state (at creation, and in a forked child: the parent's thread
        is not there, and its connection is the parent's, never used or closed here)."""
        self._pid = os.getpid()
        self._guard = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._commits = 0

    # --- writers: the background copy ------------------------------------------------------

    def committed(self) -> None:
        """A write transaction of this process committed: count it, and every `COPY_EVERY`
        commits wake the copy (the first wake starts the thread and opens its connection, once
        per process: a one-shot command that commits a few times never starts one)."""
        if self._pid != os.getpid():
            self._reset()
        self._commits += 1
        if self._commits >= COPY_EVERY:
            self._commits = 0
            if self._thread is None:
                self._start()
            self._wake.set()

    def _start(self) -> None:
        with self._guard:
            if self._closed or self._thread is not None:
                return
            try:
                self._conn = self._connect()
            except sqlite_driver.Error:  # the fallback (writers' own checkpoint) remains
                self._conn = None
                return
            self._thread = threading.Thread(
                target=self._run, args=(self._conn,), name="ledger-checkpoint", daemon=True
            )
            self._thread.start()

    def _connect(self) -> Any:
        conn = sqlite_driver.connect(str(self.path), isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            conn.execute(f"PRAGMA journal_size_limit = {SIZE_LIMIT}")
            conn.execute(_TOUCH).fetchall()
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self, conn: Any) -> None:
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._closed:
                    return
                with contextlib.suppress(sqlite_driver.Error):
                    self.copy(conn)
        finally:
            with contextlib.suppress(sqlite_driver.Error):
                conn.close()

    def copy(self, conn: Any) -> Result:
        """Copy what the log holds, never under the write lock."""
        result = catch_up(conn)
        self.copies += 1
        return result

    @contextlib.contextmanager
    def _turn(self) -> Iterator[bool]:
        """The write lock in turn, or False (no lock file here, or it did not move in time)."""
        if self.lock.path is None:
            yield False
            return
        try:
            with self.lock.held() as held:
                yield held
        except LedgerError:  # busy: a writer holds it long; the next copy tries again
            yield False

    # --- long reads --------------------------------------------------------------------------

    @contextlib.contextmanager
    def restart_point(self, raw: Any) -> Iterator[None]:
        """Around the start of a long read's snapshot on `raw` (no transaction open on it yet):
        when the log is long, copy it, then begin the snapshot on the fully copied log with the
        write lock held, so no commit slips in between and this read never holds the log's
        restart back. The lock is taken only when it is free right after a copy and the log is
        still fully copied then (held for the begin alone: no copy, no sync under it), up to
        `FREE_TRIES` times; a copy held back or busy is tried again (most often a writer caught
        between its commit and the end of its own snapshot). After that the reader takes the lock
        in turn and copies under it the few frames committed since its last copy."""
        index = log_index(self.path)
        if index is None or index[0] < RESTART_FRAMES:  # a short log: nothing to do here
            yield
            return
        for _ in range(FREE_TRIES):
            # held back is most often a writer caught between its commit and the end of its
            # snapshot (a moment): try again, and under the lock below, where no writer is
            if copied(self._copy_busy(raw)):  # begin now if no writer is mid-commit
                with self.lock.held_if_free() as held:
                    if held and _all_copied(self.path):
                        self.restarts += 1
                        yield  # the caller begins its snapshot here; the lock goes when it has
                        return
        with self._turn() as held:
            if held and (_all_copied(self.path) or copied(self._copy_busy(raw))):
                self.restarts += 1  # what was committed since the last copy, copied under it
            yield  # the caller begins its snapshot here; the lock goes when it has

    def _copy_busy(self, raw: Any) -> Result:
        """`catch_up`, tried again a few times while another copy runs (this process's thread,
        or another process's: it ends within milliseconds); busy (first item 1) if it still
        runs then, or a checkpoint failed."""
        result: Result = (1, -1, -1)
        for attempt in range(BUSY_TRIES):
            if attempt:
                time.sleep(BUSY_PAUSE_S)
            try:
                result = catch_up(raw)
            except sqlite_driver.Error:
                break
            if not result[0]:
                break
        return result

    def close(self) -> None:
        """Stop this process's thread (its connection closes with it)."""
        with self._guard:
            self._closed = True
            thread = self._thread if self._pid == os.getpid() else None
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
