"""A ledger whose database does not exist yet (issue 20 item 13, issue 25 items 2 and 3).

Invariant: nothing is created (no state directory, no database file) until the first write that
records something. Until then reads see an empty ledger (an in-memory database at the head
revision), and an operation marked `@rehearsed` runs first on that empty ledger, in a transaction
that is rolled back: an error or a refusal there is the answer, and so is a result that wrote
nothing (an empty queue, no cooldown to clear). Only an operation that would record something
creates the database and then runs on it. A database another process creates meanwhile is
adopted at the next read or write. A read-only opening never creates anything.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar

from sqlalchemy import Connection

from ledger.home import NoLedgerError, sqlite_file
from ledger.store import migrate
from ledger.store.engine import Database, WriteTxn
from ledger.validation import printable

P = ParamSpec("P")
T = TypeVar("T")
EMPTY_URL = "sqlite://"


def no_database_yet(path: Path | None) -> str:
    """The one line that says a ledger has recorded nothing yet."""
    where = f" at {printable(str(path))}" if path is not None else ""
    return (
        f"no ledger database{where} yet (nothing recorded); "
        "the first command that records something creates it"
    )


class PendingDatabase(Database):
    """A database URL with nothing behind it yet, read as an empty ledger until a write needs it.

    `prepare` runs before the database is created (the CLI creates the state directory there);
    None makes a read-only handle that never creates anything.
    """

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_ms: int = 10_000,
        clock_fn: Callable[[], int] | None = None,
        prepare: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(url, busy_timeout_ms=busy_timeout_ms, clock_fn=clock_fn)
        self._prepare = prepare
        self._path = sqlite_file(url)
        self._pending = True
        self._empty: Database | None = None
        # one thread at a time uses the empty ledger (a single in-memory connection); the
        # rehearsal flag belongs to the thread that rehearses
        self._guard = threading.RLock()
        self._rehearsal = threading.local()

    @property
    def pending(self) -> bool:
        """Nothing recorded yet: no database here (one another process created is adopted)."""
        if self._pending and self._path is not None and self._path.exists():
            with self._guard:
                if self._pending:
                    self._open(create=False)
        return self._pending

    def _open(self, *, create: bool) -> None:
        """Switch to the real database once it is checked (or, with `create`, built) at head
        (R-DB-4); the check runs on a handle of its own, so no reader sees it half-made."""
        checker = Database(self.url, busy_timeout_ms=self.busy_timeout_ms, clock_fn=self.clock_fn)
        try:
            migrate.open_checked(checker, create=create)
        except NoLedgerError:  # still being created by another process: stay empty for now
            return
        finally:
            checker.dispose()
        self._pending = False
        if self._empty is not None:
            self._empty.dispose()
            self._empty = None

    def _create(self) -> None:
        with self._guard:
            if not self._pending:
                return
            if self._prepare is None:  # a read-only handle: reads never create a ledger
                raise NoLedgerError(no_database_yet(self._path))
            self._prepare()
            self._open(create=True)

    def _empty_ledger(self) -> Database:
        with self._guard:
            if self._empty is None:
                empty = Database(
                    EMPTY_URL, busy_timeout_ms=self.busy_timeout_ms, clock_fn=self.clock_fn
                )
                migrate.open_checked(empty)
                self._empty = empty
            return self._empty

    @contextmanager
    def read(self, *, long: bool = False) -> Iterator[Connection]:
        """A read of the empty ledger while nothing is recorded, else of the database."""
        if self.pending:
            with self._guard, self._empty_ledger().read() as conn:
                yield conn
            return
        with super().read(long=long) as conn:
            yield conn

    def read_now(self, conn: Connection) -> int:
        """Ledger time for a read (on the empty ledger: this host's clock, or the injected one)."""
        if self._pending:
            return self._empty_ledger().read_now(conn)
        return super().read_now(conn)

    @contextmanager
    def write(self) -> Iterator[WriteTxn]:
        """In a rehearsal, a rolled-back write on the empty ledger; else the database's write,
        creating the database first when nothing is recorded yet."""
        if getattr(self._rehearsal, "active", False):
            with self._rehearse() as txn:
                yield txn
            return
        if self.pending:
            self._create()
        with super().write() as txn:
            yield txn

    @contextmanager
    def _rehearse(self) -> Iterator[WriteTxn]:
        empty = self._empty_ledger()
        with empty.engine.connect() as conn:
            conn.execution_options(ledger_write=True)
            transaction = conn.begin()
            try:
                txn = WriteTxn(conn, empty._ledger_now(conn))
                raw = conn.connection.dbapi_connection
                before = getattr(raw, "total_changes", 0)
                yield txn
                # rows the operation changed (the clock row written above is not counted)
                self._rehearsal.wrote |= getattr(raw, "total_changes", 0) != before
            finally:
                transaction.rollback()

    @contextmanager
    def rehearsal(self) -> Iterator[Callable[[], bool]]:
        """Writes inside go to the empty ledger and are rolled back; yields `wrote()`."""
        state = self._rehearsal
        with self._guard:
            state.active, state.wrote = True, False
            try:
                yield lambda: bool(state.wrote)
            finally:
                state.active = False

    def dispose(self) -> None:
        """Close pooled connections (the empty ledger's too)."""
        if self._empty is not None:
            self._empty.dispose()
        super().dispose()


def rehearsed(operation: Callable[P, T]) -> Callable[P, T]:
    """Mark a store operation (first argument a Database, or an object with `.db`) to be tried
    on the empty ledger first while nothing is recorded (see the module docstring)."""

    @functools.wraps(operation)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        first = args[0]
        db = getattr(first, "db", first)
        if not isinstance(db, PendingDatabase) or not db.pending:
            return operation(*args, **kwargs)
        with db.rehearsal() as wrote:
            answer = operation(*args, **kwargs)
        if not wrote():
            return answer
        return operation(*args, **kwargs)

    return run


def open_database(
    url: str,
    *,
    create: bool,
    lazy: bool = False,
    busy_timeout_ms: int = 10_000,
    clock_fn: Callable[[], int] | None = None,
    prepare: Callable[[], object] | None = None,
    throwaway: bool = False,
) -> Database:
    """The ledger's database, its schema checked (R-DB-4); `prepare` runs before one is created.

    `create`: a missing database is created now, or with `lazy` by the first write that records
    something (a PendingDatabase until then). Without `create`, a missing or empty database is a
    PendingDatabase that is never created: an empty ledger. `throwaway` (with `create`): a
    temporary SQLite file one process uses and then deletes (see `Database`), created now."""
    path = sqlite_file(url)
    if path is not None and not path.exists() and (lazy or not create):
        return PendingDatabase(
            url,
            busy_timeout_ms=busy_timeout_ms,
            clock_fn=clock_fn,
            prepare=prepare if create else None,
        )
    if create and prepare is not None and not lazy:
        prepare()
    database = Database(
        url, busy_timeout_ms=busy_timeout_ms, clock_fn=clock_fn, throwaway=throwaway
    )
    try:
        migrate.open_checked(database, create=create)
    except NoLedgerError:  # an empty database (a 0-byte file, a new server database), read-only
        database.dispose()
        return PendingDatabase(url, busy_timeout_ms=busy_timeout_ms, clock_fn=clock_fn)
    except BaseException:
        database.dispose()
        raise
    return database
