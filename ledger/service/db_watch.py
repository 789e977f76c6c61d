"""A database file replaced under the running service is noticed (R-SRV-10).

An operator restoring a copy (`mv`/`os.replace` onto `ledger.db`) leaves the service's open
connections on the old, unlinked file: SQLite then refuses their writes as read-only while CLI
processes write the new file. The watch compares the file at the database's path (st_dev, st_ino:
one `stat`, before every request but `/healthz`) with the one the service opened. A replaced file
is reopened: the pool's connections are dropped (SQLite already refuses the old file's writes,
so nothing more is written there) and the next transaction opens the file now at the path;
`/readyz` then speaks of that file (its revision). A file gone from the path is not recreated:
every request but `/healthz` answers 503 with one line saying why, until it is back.

In WAL mode a replaced file is not reopened (R-DB-3c): the `-wal` and `-shm` files beside the
path still hold the old file's committed frames, and SQLite would read them as the new file's
pages (a restore that silently brings back what it was meant to remove, or a malformed image).
Every request but `/healthz` answers 503 saying so until the service is restarted; the safe
restore stops every ledger process first (the last one to close folds the log into its file).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

GONE = (
    "the database file {path} is gone from its path (moved or deleted) since the service "
    "opened it"
)
REOPENED = "ledger serve: the database file {path} was replaced; the service reopened it"
REPLACED_UNDER_WAL = (
    "the database file {path} was replaced while the service had it open in WAL mode; its "
    "write-ahead log belongs to the old file, so the service will not open the new one: stop "
    "every ledger process, then put the copy in place and start the service again"
)


class DatabaseWatch:
    """The identity of the database file the service has open (None: not a SQLite file)."""

    def __init__(
        self,
        path: Path | None,
        reopen: Callable[[], None],
        announce: Callable[[str], None],
        wal: bool = False,
    ) -> None:
        self.path = path
        self.wal = wal
        self.reopen = reopen
        self.announce = announce
        self.reopened = 0
        self._identity = _identity(path) if path is not None else None

    def check(self) -> str | None:
        """None while the file at the path is the one open (reopened first if it was replaced);
        else one line saying why the database cannot be used."""
        if self.path is None:
            return None
        identity = _identity(self.path)
        if identity is None:
            return GONE.format(path=self.path)
        if identity != self._identity:
            if self.wal:
                return REPLACED_UNDER_WAL.format(path=self.path)
            self.reopen()
            self._identity = identity
            self.reopened += 1
            self.announce(REOPENED.format(path=self.path))
        return None


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino
