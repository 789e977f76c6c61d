"""What differs between the ledger's backends (R-DB-7): engine creation, the write lock, the clock.

SQLite serialises writers with `BEGIN IMMEDIATE` (see engine.py). PostgreSQL serialises them with
one transaction-scoped advisory lock on a single ledger key, taken as the first statement of every
write transaction, so check+insert is exact across hosts exactly as on SQLite (R-DB-2). Its ledger
time is read from the database server with `clock_timestamp()` after that lock, so workers on hosts
with skewed clocks stamp one time line (R-DB-3b). Reads run as one REPEATABLE READ snapshot, like
SQLite's deferred read transaction. Errors are mapped by SQLSTATE, never by the server's text, and
nothing shown repeats the URL (it may hold a password).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, create_engine, exc
from sqlalchemy.pool import StaticPool

from ledger.errors import (
    BadDatabaseUrlError,
    BusyError,
    DatabaseUnreachableError,
    LedgerError,
    MissingDriverError,
    ReadOnlyError,
    StorageFullError,
    StoreError,
)
from ledger.home import parse_db_url
from ledger.store import sqlite_driver

# One key for every writer of one ledger database (advisory locks are scoped to a database).
LEDGER_LOCK_KEY = 0x6C6564676572  # "ledger"
_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_SERVER_NOW = f"SELECT {_NOW_MS}"
# One round trip: the lock, then the clock. The lock sits in a FROM subquery, which PostgreSQL
# never flattens (a volatile target list), so its row, and the lock, exist before the outer
# select list reads the clock (R-DB-3b: a writer that waited never stamps an old time).
_LOCK_THEN_NOW = (
    f"SELECT {_NOW_MS} FROM (SELECT pg_advisory_xact_lock({LEDGER_LOCK_KEY})) AS locked"
)
_LOCKED_AT = "ledger_locked_at_ms"  # connection info: the server time read with the lock
_READ_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"


def make_engine(url: str, busy_timeout_ms: int) -> Engine:
    """An engine for a supported URL; PostgreSQL writers wait at most the busy timeout."""
    parsed = parse_db_url(url)
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        # `options` is a libpq startup parameter: no statement, no transaction on connect.
        given = parsed.query.get("options")
        options = f"-c lock_timeout={int(busy_timeout_ms)}"
        if isinstance(given, str) and given:
            options = f"{given} {options}"
        kwargs["connect_args"] = {"options": options}
        # A pooled session the server dropped (restart, failover) is replaced at checkout.
        kwargs["pool_pre_ping"] = True
    else:  # SQLite: the one library every opener links (R-DB-3c)
        kwargs["module"] = sqlite_driver.driver
    if parsed.get_backend_name() != "postgresql" and parsed.database in (None, "", ":memory:"):
        # one in-memory database for every thread of this process (the empty ledger read while
        # nothing is recorded yet), not one per thread
        kwargs["poolclass"] = StaticPool
        kwargs["connect_args"] = {"check_same_thread": False}
    try:
        engine = create_engine(parsed, **kwargs)
    except ImportError as error:
        raise MissingDriverError() from error
    except exc.ArgumentError as error:
        raise BadDatabaseUrlError() from error
    return engine


# The largest row id each backend's `integer` id column can hold: an id past it names no row.
_ROW_ID_MAX = {"postgresql": 2**31 - 1, "sqlite": 2**63 - 1}


def can_be_row_id(conn: Connection, row_id: int) -> bool:
    """Whether `row_id` fits the backend's id column (else the driver or server refuses it)."""
    return 0 < row_id <= _ROW_ID_MAX.get(conn.dialect.name, 2**31 - 1)


def postgres_begin(conn: Connection) -> None:
    """First statement of a PostgreSQL transaction: the ledger lock (and the server's time
    after it) for writes, a snapshot else."""
    if conn.get_execution_options().get("ledger_write"):
        conn.info[_LOCKED_AT] = int(conn.exec_driver_sql(_LOCK_THEN_NOW).scalar_one())
    else:
        conn.exec_driver_sql(_READ_SNAPSHOT)


def server_now_ms(conn: Connection, *, locked: bool = False) -> int:
    """The PostgreSQL server's wall clock in UTC ms. `locked`: in a write transaction, the time
    read together with its lock (R-DB-3b), once; otherwise (reads) asked now."""
    if locked:
        at = conn.info.pop(_LOCKED_AT, None)
        if at is not None:
            return int(at)
    return int(conn.exec_driver_sql(_SERVER_NOW).scalar_one())


# SQLSTATE classes and codes -> the ledger's fixed-message errors.
_BUSY = {"55P03", "57014", "40001", "40P01"}  # lock timeout, cancelled, serialization, deadlock
_FULL = {"53100", "53200", "54000"}  # disk full, out of memory, program limit
_READ_ONLY = {"25006"}


def translate_postgres(error: BaseException) -> LedgerError | None:
    """A ledger error for a psycopg error, judged by SQLSTATE only; None when not PostgreSQL's."""
    orig = getattr(error, "orig", error)
    module = type(orig).__module__
    if not module.startswith("psycopg"):
        return None
    state = str(getattr(orig, "sqlstate", None) or "")
    if state in _BUSY:
        return BusyError()
    if state in _FULL:
        return StorageFullError()
    if state in _READ_ONLY:
        return ReadOnlyError()
    # 08: connection exceptions, 28: bad credentials, 3D: no such database, 57P: server shutting
    # down; no SQLSTATE at all: libpq could not connect (refused, unknown host, no socket).
    if not state or state[:2] in {"08", "28", "3D"} or state.startswith("57P"):
        return DatabaseUnreachableError()
    return StoreError("database error; nothing was written")
