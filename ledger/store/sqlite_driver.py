"""The SQLite library the ledger links (R-DB-3a, R-DB-3c): one choice for every opener.

`pysqlite3` (a wheel with a recent SQLite built in, free of the WAL-reset bug) when it is
importable, else the standard library's `sqlite3` (linked to the system's library, which may be
affected). The store's engine, the migrations, backups and the bench's floor all open files with
`driver`, so one process never mixes two libraries on one file (see `connect`).
`LEDGER_SQLITE=stdlib` picks the standard library even where the wheel is installed (tests of
the fallback, and an operator who must match another tool's library); it can only make the
ledger more careful, never less: the journal mode still follows the linked library's version.
"""

from __future__ import annotations

import os
import sqlite3
from types import ModuleType
from typing import Any


def _load() -> tuple[ModuleType, str]:
    if os.environ.get("LEDGER_SQLITE", "").strip().lower() != "stdlib":
        try:
            from pysqlite3 import dbapi2  # type: ignore[import-untyped]  # lazy: optional wheel
        except ImportError:
            pass
        else:
            return dbapi2, "pysqlite3"
    return sqlite3, "sqlite3"


driver, LIBRARY = _load()
Error: type[Exception] = driver.Error
OperationalError: type[Exception] = driver.OperationalError


def library_version() -> str:
    """The linked SQLite library's version (what R-DB-3a judges), e.g. `3.53.4`."""
    return str(driver.sqlite_version)


def connect(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> sqlite3.Connection:
    """A DB-API connection from the linked library (the same class shape as the stdlib's).

    Anything that opens a ledger file opens it with this. Two SQLite libraries in one process
    do not share their POSIX lock bookkeeping, so one closing a file drops the other's locks
    and each can read the other's uncheckpointed WAL frames wrongly (measured: the stdlib's
    reads missed rows the bundled library had committed). Separate processes on different
    libraries share a WAL file safely, locks being per process.
    """
    conn: sqlite3.Connection = driver.connect(path, *args, **kwargs)
    return conn
