"""The SQLite journal mode in force, and the one explicit way to change it (R-DB-3a, R-DB-3c).

A database opened by a safe library is turned to WAL when it opens; turning it back to the
rollback journal is never a side effect: `ledger db journal truncate` does it here, with the
write lock held so no ledger writer is mid-transaction, through one connection of the linked
library. SQLite itself refuses the change while another connection has the file open in WAL
(the answer is then `busy`, and nothing changed).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import UsageError
from ledger.store import sqlite_driver
from ledger.store.engine import chosen_journal_mode, translate, wal_is_safe
from ledger.store.writelock import WriteLock, lock_path

MODES = ("wal", "truncate")


@dataclass(frozen=True)
class JournalState:
    """The linked library and the file's journal: `wal` or `rollback` (None: no file yet).

    A rollback journal's flavour belongs to each connection, not to the file: the ledger's own
    connections use `chosen` (`truncate` on an affected library; a safe one turns the file to
    `wal` when it opens it).
    """

    library: str
    version: str
    safe: bool
    mode: str | None
    chosen: str

    def to_json(self) -> dict[str, object]:
        return {
            "library": self.library,
            "sqlite_version": self.version,
            "wal_safe": self.safe,
            "journal": self.mode,
            "ledger_opens_it_in": self.chosen,
        }


def _mode(path: Path) -> str:
    conn = sqlite_driver.connect(str(path), isolation_level=None)
    try:
        row = conn.execute("PRAGMA journal_mode").fetchone()
        return "wal" if str(row[0]).lower() == "wal" else "rollback"
    finally:
        conn.close()


def journal_state(path: Path) -> JournalState:
    """What `ledger db journal` prints; reads the file's mode without changing it."""
    version = sqlite_driver.library_version()
    mode: str | None = None
    if path.exists():
        try:
            mode = _mode(path)
        except sqlite_driver.Error as error:
            raise translate(error) from error
    chosen = chosen_journal_mode(version)
    return JournalState(sqlite_driver.LIBRARY, version, wal_is_safe(version), mode, chosen)


def set_journal_mode(url: str, path: Path, mode: str, busy_timeout_ms: int) -> JournalState:
    """Turn the file to `mode` (`wal` only on a safe library), holding the write lock."""
    if mode not in MODES:
        raise UsageError(f"unknown journal mode; choose one of: {', '.join(MODES)}")
    if mode == "wal" and not wal_is_safe(sqlite_driver.library_version()):
        raise UsageError(
            f"SQLite {sqlite_driver.library_version()} ({sqlite_driver.LIBRARY}) has the "
            "WAL-reset bug: WAL needs the pysqlite3 wheel or a SQLite of 3.51.3 or newer"
        )
    lock = WriteLock(lock_path(url), busy_timeout_ms)
    try:
        with lock.held():
            conn = sqlite_driver.connect(str(path), isolation_level=None)
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
                row = conn.execute(f"PRAGMA journal_mode = {mode}").fetchone()  # a fixed literal
            finally:
                with contextlib.suppress(sqlite_driver.Error):
                    conn.close()
    except sqlite_driver.Error as error:
        raise translate(error) from error
    if not row or str(row[0]).lower() != mode:  # SQLite answers with the mode in force
        raise translate(sqlite_driver.OperationalError("database is locked"))
    return journal_state(path)
