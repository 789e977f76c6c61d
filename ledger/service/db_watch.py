"""A database file replaced under the running service is noticed (R-SRV-10).

An operator restoring a copy (`mv`/`os.replace` onto `ledger.db`) leaves the service's open
connections on the old, unlinked file: SQLite then refuses their writes as read-only while CLI
processes write the new file. The watch compares the file at the database's path (st_dev, st_ino:
one `stat`, before every request but `/healthz`) with the one the service opened. A replaced file
is reopened: the pool's connections are dropped (SQLite already refuses the old file's writes,
so nothing more is written there) and the next transaction opens the file now at the path;
`/readyz` then speaks of that file (its revision). A file gone from the path is not recreated:
every request but `/healthz` answers 503 with one line saying why, until it is back.
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


class DatabaseWatch:
    """The identity of the database file the service has open (None: not a SQLite file)."""

    def __init__(
        self, path: Path | None, reopen: Callable[[], None], announce: Callable[[str], None]
    ) -> None:
        self.path = path
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
