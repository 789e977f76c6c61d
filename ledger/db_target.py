"""Where the database lives (R-HOME-2), checked before an engine is built.

Invariant: a bad `--db` / `$LEDGER_DB` ends as one fixed line and exit 2 (bad input) or 4 (the
store cannot be read), never a hang and never the URL's text (it may hold a password); a command
that only reads (`create=False`) creates nothing: no directory, no database file (a missing one
is read as an empty ledger, see ledger/store/pending.py). A database path whose directory does
not exist is refused for reads too (issue 29 item 12): a mistyped `--db` must not look like a
healthy empty ledger; only the state directory itself (a fresh `--home`) may be missing.
"""

from __future__ import annotations

import stat
from pathlib import Path

from ledger.errors import MissingDriverError, StoreError, UsageError
from ledger.home import parse_db_url, sqlite_file


class NoLedgerError(StoreError):
    """no ledger database here yet (nothing recorded); a read-only command never creates one"""


class NotAFileError(StoreError):
    """the database path is not a regular file (a FIFO, a device or a directory); not opened"""


def check_db_url(url: str) -> None:
    """Refuse a URL whose backend is unsupported or whose driver is not installed (exit 2)."""
    parsed = parse_db_url(url)  # BadDatabaseUrlError: unsupported, malformed (never echoed)
    try:
        parsed.get_dialect().import_dbapi()
    except ImportError as exc:
        raise MissingDriverError() from exc


def check_db_target(url: str, *, home: Path | None = None) -> None:
    """Check the URL and, for an SQLite file, that it can be opened without blocking or creating
    anything a read must not create. `home` is the state directory a write is about to create."""
    check_db_url(url)
    path = sqlite_file(url)
    if path is not None:
        check_sqlite_path(path, home=home)


def check_sqlite_path(path: Path, *, home: Path | None = None) -> None:
    """An existing regular file, or a missing one in an existing directory or in the state
    directory `home` (which a write creates next; a read answers as an empty ledger)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise NotAFileError() from exc
    if info is not None:
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the first read forever
            raise NotAFileError()
        return
    if path.is_symlink():
        raise UsageError("the database path is a symlink to nothing (dangling); fix or remove it")
    # a fresh state directory reads as an empty ledger (created by the first write); any other
    # missing directory is a mistyped path, for a read as for a write
    parent = path.absolute().parent
    if not parent.is_dir() and parent != home:
        raise UsageError("the database's directory does not exist; create it first")
