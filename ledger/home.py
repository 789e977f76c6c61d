"""The state directory (R-HOME-1..3): where ledger.db, recovery.json and catalog.json live."""


from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import exc
from sqlalchemy.engine import URL, make_url

from ledger.errors import BadDatabaseUrlError, MissingDriverError, StoreError, UsageError

DB_FILE = "ledger.db"
SUPPORTED_BACKENDS = frozenset({"sqlite", "postgresql"})


def parse_db_url(url: str) -> URL:
    """The URL of a supported backend (R-HOME-2), or a usage error that never repeats the URL."""
    try:
        parsed = make_url(url)
        backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    except (exc.ArgumentError, ValueError) as error:
        raise BadDatabaseUrlError() from error
    if backend not in SUPPORTED_BACKENDS or (backend == "postgresql" and driver != "psycopg"):
        raise BadDatabaseUrlError()
    return parsed


@dataclass(frozen=True)
class StateDir:
    """A resolved state directory and the database URL to use."""

    path: Path
    db_url: str

    @property
    def db_path(self) -> Path | None:
        """The SQLite file, when the database is a local SQLite file."""
        return sqlite_file(self.db_url)


def sqlite_file(url: str) -> Path | None:
    """The file behind a SQLite URL; None for other backends, memory and `file:` URIs."""
    parsed = parse_db_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or not name or ":memory:" in name:
        return None
    if "uri" in parsed.query:
        return None
    return Path(name)


def resolve_home(home: str | None, env: Mapping[str, str] | None = None) -> Path:
    """--home, else $LEDGER_HOME, else $XDG_STATE_HOME/ledger, else ~/.local/state/ledger."""
    env = os.environ if env is None else env
    if home:
        return expand(home, "--home")
    if env.get("LEDGER_HOME"):
        return expand(env["LEDGER_HOME"], "$LEDGER_HOME")
    if env.get("XDG_STATE_HOME"):
        return expand(env["XDG_STATE_HOME"], "$XDG_STATE_HOME") / "ledger"
    return expand("~/.local/state/ledger", "the default state directory")


def expand(value: str, what: str) -> Path:
    """`~` and `~user` expanded; an unknown user is bad input (the value is never echoed)."""
    try:
        return Path(value).expanduser()
    except RuntimeError as exc:  # `~nosuchuser`, or no home directory at all
        raise UsageError(f"{what}: `~` names a user without a home directory") from exc


def resolve_db_url(home: Path, db: str | None, env: Mapping[str, str] | None = None) -> str:
    """--db URL, else $LEDGER_DB, else ledger.db in the state directory (R-HOME-2)."""
    env = os.environ if env is None else env
    value = db or env.get("LEDGER_DB") or ""
    if not value:
        return f"sqlite:///{(home / DB_FILE).absolute()}"
    if "://" in value:
        return value
    return f"sqlite:///{expand(value, '--db').absolute()}"


def ensure_home(path: Path) -> Path:
    """Create the state directory with mode 0700 (an existing one is left as it is)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError("the state directory cannot be created") from exc
    return path


def symlink_warning(path: Path) -> str | None:
    """A warning when the state directory is a symlink to a directory another user owns."""
    try:
        if not path.is_symlink():
            return None
        target = path.resolve()
        owner = target.stat().st_uid
    except OSError:
        return None
    if owner != os.getuid():
        return "warning: the state directory is a symlink into a directory owned by another user"
    return None


def secure_file(path: Path) -> None:
    """Make a database file (and its journal siblings) readable by the owner only."""
    for candidate in (path, *(path.with_name(path.name + s) for s in ("-journal", "-wal", "-shm"))):
        try:
            if candidate.exists() and stat.S_IMODE(candidate.stat().st_mode) != 0o600:
                candidate.chmod(0o600)
        except OSError:
            continue


def state_dir(home: str | None, db: str | None) -> StateDir:
    """Resolve the state directory and database URL for this process."""
    path = resolve_home(home)
    url = resolve_db_url(path, db)
    parse_db_url(url)  # a bad --db / $LEDGER_DB is one line and exit 2 before anything opens
    return StateDir(path=path, db_url=url)


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


def write_atomic(target: Path, data: bytes, mode: int | None = None) -> None:
    """Replace `target` with `data` atomically (`mode`: the new file's permissions)."""
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temp_name, mode)
        os.replace(temp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
    fsync_dir(target.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename durable where the platform allows fsync on a directory."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
