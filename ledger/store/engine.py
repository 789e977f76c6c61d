"""Engine, connection PRAGMAs and the one write-transaction opener (the only backend-specific code).

Every write goes through `Database.write()`: `BEGIN IMMEDIATE` on SQLite, so the transaction starts
as the writer and reads inside it see what it decides on (R-DB-2). The ledger's time is read after
the lock is taken and never moves backwards (R-DB-3b). Reads use short deferred transactions.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    BindParameter,
    Connection,
    Engine,
    bindparam,
    case,
    event,
    exc,
    insert,
    select,
    update,
)

from ledger.clock import now_ms
from ledger.errors import (
    SQLITE_BUSY,
    BusyError,
    DatabaseUnreachableError,
    LedgerError,
    ReadOnlyError,
    StorageFullError,
    StoreError,
    UnreadableDatabaseError,
    UsageError,
)
from ledger.home import sqlite_file
from ledger.store import dialects, sqlite_driver
from ledger.store.checkpoint import Checkpointer, connection_pragmas
from ledger.store.hot import Hot
from ledger.store.schema import clock
from ledger.store.writelock import WriteLock, lock_path

NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "9p", "afs", "ncpfs", "fuse.sshfs"}
)


def wal_is_safe(version: str) -> bool:
    """False for SQLite libraries with the WAL-reset corruption bug (R-DB-3a)."""
    try:
        parts = tuple(int(p) for p in version.split(".")[:3])
    except ValueError:
        return False
    v = parts + (0,) * (3 - len(parts))
    if v < (3, 7, 0):
        return False  # no WAL at all
    if v >= (3, 51, 3):
        return True
    if (3, 50, 7) <= v < (3, 51, 0):
        return True
    return (3, 44, 6) <= v < (3, 45, 0)


def chosen_journal_mode(version: str | None = None) -> str:
    """`wal` where the library is safe, else a rollback journal that commits durably.

    The rollback journal is `truncate`, not SQLite's default `delete`: in `delete` mode a
    commit is the journal's unlink, which `synchronous=FULL` does not sync (only `EXTRA` syncs
    the directory), so after a power cut the journal can come back and roll the last committed
    reservation away (R-DB-3: a slot must not be handed out twice). In `truncate` mode FULL
    syncs the truncation, and a commit changes no directory entry, which is also cheaper.
    """
    return "wal" if wal_is_safe(version or sqlite_driver.library_version()) else "truncate"


class UnsafeWalError(UsageError):
    """A WAL database met by a process whose SQLite has the WAL-reset bug (R-DB-3c): exit 2."""

    def __init__(self) -> None:
        super().__init__(
            f"the database is in WAL mode and this process links SQLite "
            f"{sqlite_driver.library_version()} ({sqlite_driver.LIBRARY}), which has the "
            "WAL-reset bug: run it where the pysqlite3 wheel is installed, or turn the file back "
            "to the rollback journal with `ledger db journal truncate`"
        )


def network_filesystem(path: Path, mounts_file: Path = Path("/proc/mounts")) -> str | None:
    """The filesystem type when `path` lies on a network filesystem, else None."""
    try:
        lines = mounts_file.read_text().splitlines()
    except OSError:
        return None
    target = str(path.absolute())
    best: tuple[int, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = fields[1].replace("\\040", " ")
        prefix = mount_point.rstrip("/") + "/"
        if (target == mount_point or target.startswith(prefix) or mount_point == "/") and (
            best is None or len(mount_point) > best[0]
        ):
            best = (len(mount_point), fields[2])
    if best and best[1] in NETWORK_FILESYSTEMS:
        return best[1]
    return None


def translate(error: BaseException) -> LedgerError:
    """Map a driver error to the ledger's fixed-message errors (never the driver's text)."""
    backend_error = dialects.translate_postgres(error)
    if backend_error is not None:
        return backend_error
    text = str(getattr(error, "orig", error)).lower()
    if "locked" in text or "busy" in text:
        return BusyError(SQLITE_BUSY)
    if "full" in text:
        return StorageFullError()
    if "readonly" in text or "read-only" in text or "unable to open" in text:
        return ReadOnlyError()
    if "not a database" in text or "malformed" in text or "encrypted" in text:
        return UnreadableDatabaseError()
    return StoreError("database error; nothing was written")


_BEGIN_WRITE = "BEGIN IMMEDIATE"
_BEGIN_READ = "BEGIN DEFERRED"
_TOUCH = "SELECT newest_ms FROM clock WHERE id = 1"
_RECONNECT_PAUSE_S = 0.2  # between attempts to reach a PostgreSQL server that went away
_WALL: BindParameter[int] = bindparam("wall", type_=BigInteger)
_READ_CLOCK = select(clock.c.newest_ms).where(clock.c.id == 1)
_INSERT_CLOCK = insert(clock).values(id=1, newest_ms=_WALL)
# One round trip: move the stored time forward (never back) and read the time in force.
_ADVANCE_CLOCK = (
    update(clock)
    .where(clock.c.id == 1)
    .values(newest_ms=case((clock.c.newest_ms < _WALL, _WALL), else_=clock.c.newest_ms))
    .returning(clock.c.newest_ms)
)
_HOT_ADVANCE_CLOCK = Hot(_ADVANCE_CLOCK)
STATEMENT_CACHE = 1024
"""Prepared statements each SQLite connection keeps (the driver's `cached_statements`). The
bundled driver's cache keeps the most used statements first and puts a new one last, where the
next miss evicts it: once full (a new ledger's migration alone sends some 110 distinct
statements, past the driver's default of 100), the statements of a reserve and a settle evicted
one another and were compiled again on every run (measured: 13 of a cycle's 15, half its CPU).
Every statement a process of the ledger sends fits in this many, at a few KiB each."""


def _statement_cache(_dialect: Any, _record: Any, _args: Any, params: dict[str, Any]) -> None:
    params.setdefault("cached_statements", STATEMENT_CACHE)


@dataclass
class WriteTxn:
    """An open write transaction and the ledger time taken after its lock."""

    conn: Connection
    now: int


class Database:
    """An engine with ledger PRAGMAs plus read and write transaction helpers."""

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_ms: int = 10_000,
        clock_fn: Callable[[], int] | None = None,
        journal_mode: str | None = None,
        throwaway: bool = False,
    ) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        # A throw-away SQLite file (the simulator's temporary ledger, used by this one process
        # and deleted after): durability is irrelevant there, so no fsync, the rollback journal
        # in memory and no write-lock file. Never the default; the CLI never sets it.
        self.throwaway = throwaway and self.is_sqlite
        self.busy_timeout_ms = busy_timeout_ms
        # PostgreSQL: the server's clock unless a clock is handed in (tests); SQLite: this host's.
        self.server_clock = clock_fn is None and not self.is_sqlite
        self.server_offset_ms = 0  # server clock - this host's, as last seen in a transaction
        self.clock_fn = clock_fn or (self._server_aligned_now if self.server_clock else now_ms)
        self.journal_mode = (
            "memory" if self.throwaway else journal_mode or chosen_journal_mode()
        )
        # Pooled connections: PRAGMAs and SQLite's schema parse happen once per connection, not
        # once per transaction. A connection never crosses a fork (see _on_checkout).
        self.engine: Engine = dialects.make_engine(url, busy_timeout_ms)
        # SQLite writers first queue on a lock file, in turn (ledger/store/writelock.py)
        self.write_lock = WriteLock(
            lock_path(url) if self.is_sqlite and not self.throwaway else None, busy_timeout_ms
        )
        self._returning = bool(getattr(self.engine.dialect, "update_returning", False))
        # An affected library (R-DB-3c): a safe process elsewhere may turn the file to WAL while
        # this one's pooled connections are open in the rollback journal; each write looks at
        # the file's header once its lock is taken (no conversion can happen after that).
        self._sqlite_path = (
            sqlite_file(url)
            if self.is_sqlite
            and not self.throwaway
            and not wal_is_safe(sqlite_driver.library_version())
            else None
        )
        # WAL checkpoints off the reserve path (ledger/store/checkpoint.py)
        wal_file = sqlite_file(url) if self.is_sqlite and not self.throwaway else None
        self.checkpointer = (
            Checkpointer(wal_file, self.write_lock, busy_timeout_ms)
            if wal_file is not None and self.journal_mode == "wal"
            else None
        )
        self._reached = False  # a session was opened once: a later refusal is an outage
        # SQLite: the connection of the last transaction that ended well, kept checked out for
        # the next (by pid: never used in a forked child); see `_connect`
        self._spare: list[tuple[int, Connection]] = []
        event.listen(self.engine, "connect", self._on_connect_record_pid)
        event.listen(self.engine, "connect", self._on_reached)
        event.listen(self.engine, "checkout", self._on_checkout)
        if self.is_sqlite:
            event.listen(self.engine, "do_connect", _statement_cache)
            event.listen(self.engine, "connect", self._on_connect)
            event.listen(self.engine, "begin", self._on_begin)
        else:
            event.listen(self.engine, "begin", dialects.postgres_begin)

    @property
    def pending(self) -> bool:
        """True while nothing is recorded and no database exists yet (ledger/store/pending.py)."""
        return False

    @staticmethod
    def _on_connect_record_pid(_dbapi_conn: Any, record: Any) -> None:
        record.info["pid"] = os.getpid()

    def _on_reached(self, _dbapi_conn: Any, _record: Any) -> None:
        self._reached = True

    @staticmethod
    def _on_checkout(_dbapi_conn: Any, record: Any, proxy: Any) -> None:
        # A pooled connection inherited through fork() belongs to the parent: never use it.
        if record.info.get("pid") != os.getpid():
            record.dbapi_connection = proxy.dbapi_connection = None
            raise exc.DisconnectionError("connection belongs to another process")

    def _on_connect(self, dbapi_conn: Any, _record: Any) -> None:
        # PRAGMAs when a connection opens, never inside a transaction (R-DB-3).
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            cur.execute("PRAGMA foreign_keys = ON")
            cur.execute(f"PRAGMA synchronous = {'OFF' if self.throwaway else 'FULL'}")
            row = cur.execute("PRAGMA journal_mode").fetchone()
            current = str(row[0]).lower() if row else ""
            if current == "wal" and self.journal_mode != "wal":
                # never a side effect: back to the rollback journal is `ledger db journal`
                raise UnsafeWalError()
            if current != self.journal_mode and current != "memory":
                # another process may hold it open; the mode in force is reported by status
                with contextlib.suppress(sqlite_driver.OperationalError):
                    cur.execute(f"PRAGMA journal_mode = {self.journal_mode}")
            if self.journal_mode == "wal":
                for pragma in connection_pragmas():
                    cur.execute(pragma)
        finally:
            cur.close()

    def _file_is_wal(self) -> bool:
        """The database header's read/write versions (bytes 18-19) are 2 in WAL mode."""
        if self._sqlite_path is None:
            return False
        try:
            fd = os.open(self._sqlite_path, os.O_RDONLY)
        except OSError:
            return False
        try:
            return os.pread(fd, 2, 18) == b"\x02\x02"
        finally:
            os.close(fd)

    def _on_begin(self, conn: Connection) -> None:
        # straight on the driver's connection: SQLAlchemy's statement path would cost more than
        # the BEGIN itself on every transaction; a driver error (busy) is translated by the
        # caller like any other (`write` / `read` catch sqlite3.Error)
        sql = _BEGIN_WRITE if conn.get_execution_options().get("ledger_write") else _BEGIN_READ
        raw = conn.connection.driver_connection
        if raw is None:  # pragma: no cover - an invalidated connection: SQLAlchemy raises
            conn.exec_driver_sql(sql)
            return
        raw.execute(sql)
        if self._sqlite_path is not None and sql is _BEGIN_WRITE and self._file_is_wal():
            raw.execute("ROLLBACK")
            raise UnsafeWalError()

    @contextmanager
    def write(self) -> Iterator[WriteTxn]:
        """One write transaction: lock first, then read the ledger time, then decide and write."""
        try:
            with self._opened(write=True) as (conn, now):
                yield WriteTxn(conn, now)
        except exc.DBAPIError as error:
            raise translate(error) from error
        except sqlite_driver.Error as error:
            raise translate(error) from error

    @contextmanager
    def read(self, *, long: bool = False) -> Iterator[Connection]:
        """One short deferred read transaction. `long`: a read that may take a while (the
        status document): its snapshot starts where the WAL can start over (checkpoint.py)."""
        try:
            with self._opened(write=False, long=long) as (conn, _now):
                yield conn
        except exc.DBAPIError as error:
            raise translate(error) from error
        except sqlite_driver.Error as error:
            raise translate(error) from error

    @contextmanager
    def _opened(self, *, write: bool, long: bool = False) -> Iterator[tuple[Connection, int]]:
        """A begun transaction (a write: its lock taken and the ledger time read, else 0).

        Opening it writes nothing durable, so a PostgreSQL session found dropped meanwhile (a
        restart, a failover) is replaced and the opening tried again, until the server is back
        or the busy timeout has passed; only for a process that has reached the server before.
        Once the caller's block runs, nothing is retried: the transaction may have committed.
        """
        first_failure: float | None = None
        while True:
            stack = ExitStack()
            try:
                conn = stack.enter_context(self._connect())
                conn.execution_options(ledger_write=write)
                if write:
                    stack.enter_context(self.write_lock.held())
                if long and self.checkpointer is not None:
                    self._begin_long_read(conn, stack)
                else:
                    stack.enter_context(conn.begin())
                now = self._ledger_now(conn) if write else 0
            except exc.DBAPIError as error:
                with contextlib.suppress(exc.DBAPIError):  # a rollback on a dead session
                    stack.__exit__(type(error), error, error.__traceback__)
                first_failure = first_failure or time.monotonic()
                if not self._reconnect_wait(error, first_failure):
                    raise
                continue
            except BaseException as error:
                stack.__exit__(type(error), error, error.__traceback__)
                raise
            with stack:  # committed when the caller's block ends, rolled back if it raises
                yield conn, now
            if write and self.checkpointer is not None:
                self.checkpointer.committed()
            return

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        """A connection for one transaction. On SQLite the last transaction's when it ended
        well: it is kept checked out for the next, not given back to the pool (a checkout and a
        return were ~15% of a reserve+settle cycle's instructions); it holds no lock and no
        snapshot between transactions, like an idle pooled one. A transaction that raises
        returns its connection to the pool (reset there); PostgreSQL's always go back (the pool
        pings them at checkout)."""
        conn: Connection | None = None
        while self._spare and conn is None:
            try:
                pid, kept = self._spare.pop()
            except IndexError:  # another thread took it meanwhile
                break
            if pid == os.getpid() and not kept.closed and not kept.invalidated:
                conn = kept
            elif not kept.closed:  # invalid, or the parent's in a forked child: to the pool, whose
                kept.close()  # checkout drops it unused (`_on_checkout`), like its idle ones
        if conn is None:
            conn = self.engine.connect()
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        if self.is_sqlite and not self._spare and not conn.invalidated:
            self._spare.append((os.getpid(), conn))
        else:
            conn.close()

    def _begin_long_read(self, conn: Connection, stack: ExitStack) -> None:
        """Begin a read's snapshot at a restart point of the WAL (checkpoint.py)."""
        assert self.checkpointer is not None
        raw = conn.connection.driver_connection
        assert raw is not None  # a pooled connection that is open
        with self.checkpointer.restart_point(raw):
            stack.enter_context(conn.begin())
            raw.execute(_TOUCH).fetchall()  # the snapshot starts here, not at the first read

    def _reconnect_wait(self, error: exc.DBAPIError, since: float) -> bool:
        """Whether to open the transaction again after `error`, having paused before it."""
        if self.is_sqlite or not self._reached:
            return False
        if not isinstance(dialects.translate_postgres(error), DatabaseUnreachableError):
            return False
        waited = time.monotonic() - since
        if waited * 1000 >= self.busy_timeout_ms:
            return False
        if waited > 0:  # the first retry goes at once (a stale session), later ones back off
            time.sleep(min(_RECONNECT_PAUSE_S, self.busy_timeout_ms / 1000 - waited))
        return True

    def _ledger_now(self, conn: Connection) -> int:
        """max(wall clock, newest stored time), stored back so time never moves backwards."""
        wall = self._wall(conn, locked=True)
        if self._returning:
            newest = _HOT_ADVANCE_CLOCK.scalar(conn, {"wall": wall})
            if newest is not None:
                return int(newest)
        else:  # pragma: no cover - backends without UPDATE ... RETURNING
            newest = conn.execute(_READ_CLOCK).scalar()
            if newest is not None:
                if wall > newest:
                    conn.execute(update(clock).where(clock.c.id == 1).values(newest_ms=wall))
                return max(wall, int(newest))
        conn.execute(_INSERT_CLOCK, {"wall": wall})
        return wall

    def read_now(self, conn: Connection) -> int:
        """Ledger time for a read path (never before the newest stored time; writes nothing)."""
        newest = conn.execute(_READ_CLOCK).scalar()
        return max(self._wall(conn), int(newest or 0))

    def _wall(self, conn: Connection, *, locked: bool = False) -> int:
        if not self.server_clock:
            return int(self.clock_fn())
        server = dialects.server_now_ms(conn, locked=locked)
        self.server_offset_ms = server - now_ms()
        return server

    def _server_aligned_now(self) -> int:
        """This host's clock moved onto the server's time line (workers time calls against
        deadlines the server stamped, so a skewed host neither cuts nor stretches them)."""
        return now_ms() + self.server_offset_ms

    def dispose(self) -> None:
        """Close pooled connections (and stop the checkpoint thread)."""
        if self.checkpointer is not None:
            self.checkpointer.close()
        while self._spare:  # back to the pool, which closes it like its idle ones
            _pid, conn = self._spare.pop()
            if not conn.closed:
                conn.close()
        self.engine.dispose()
