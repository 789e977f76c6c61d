"""Schema revisions (R-DB-1, R-DB-4, R-DB-5): create at head, refuse old/new, upgrade with a backup.

Only alembic changes the schema; a new database is built by running the migrations. Checking the
revision of an existing database needs neither alembic nor the revision scripts (a plain read of
`alembic_version` against `HEAD_REVISION`), so alembic is imported only to create, upgrade or
downgrade.
"""

from __future__ import annotations

import errno
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, column, exc, inspect, select, table, text

from ledger.errors import (
    BusyError,
    ReadOnlyError,
    SchemaTooNewError,
    SchemaTooOldError,
    StorageFullError,
    StoreError,
    UnreadableDatabaseError,
)
from ledger.home import NoLedgerError, secure_file, sqlite_file
from ledger.store import sqlite_driver
from ledger.store.engine import Database, translate
from ledger.store.schema import meta

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# The newest revision in migrations/versions and every revision there. Kept here so that opening an
# up-to-date database does not load alembic; tests/test_migrate_head.py checks both against
# alembic's ScriptDirectory and the versions folder (add a migration: update these two).
HEAD_REVISION = "0016"
KNOWN_REVISIONS = frozenset(
    {"0001", "0002", "0003b", "0004", "0005", "0006", "0007", "0008", "0009", "0010", "0011",
     "0012", "0013", "0014", "0015", "0016"}
)
VERSION_TABLE = "alembic_version"

_VERSION = table(VERSION_TABLE, column("version_num"))
_READ_VERSION = select(_VERSION.c.version_num)

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def _migrations_dir() -> Path:
    try:
        import migrations  # lazy: the shipped alembic scripts, only for a migration

        for entry in migrations.__path__:  # a regular or (old editable install) namespace package
            if (Path(entry) / "env.py").exists():
                return Path(entry).resolve()
        return MIGRATIONS_DIR
    except ImportError:  # pragma: no cover - source checkout without install
        return MIGRATIONS_DIR


def alembic_config(connection: Connection | None = None) -> Config:
    """An alembic Config pointing at the shipped migrations, optionally bound to a connection."""
    from alembic.config import Config  # lazy: alembic only for a migration

    cfg = Config()
    cfg.set_main_option("script_location", str(_migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def script() -> ScriptDirectory:
    """The revision scripts."""
    from alembic.script import ScriptDirectory  # lazy: alembic only for a migration

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this code knows."""
    return HEAD_REVISION


def known_revisions() -> set[str]:
    """Every revision id this code knows."""
    return set(KNOWN_REVISIONS)


def read_revision(conn: Connection) -> str | None:
    """The revision stamped in `alembic_version` (None without one), read without alembic."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    heads = conn.execute(_READ_VERSION).scalars().all()
    if len(heads) > 1:  # never written by a linear history: let alembic report it as before
        from alembic.runtime.migration import MigrationContext  # lazy: alembic only for a migration

        return MigrationContext.configure(conn).get_current_revision()
    return str(heads[0]) if heads else None


def current_revision(db: Database) -> str | None:
    """The database's revision, or None for an empty database."""
    with db.read() as conn:
        return read_revision(conn)


def _has_tables(conn: Connection) -> bool:
    return bool(set(inspect(conn).get_table_names()) - {VERSION_TABLE})


def _prepare_file(db: Database) -> None:
    """Create a missing SQLite file 0600 so it is never world-readable, even for a moment."""
    path = db_file(db)
    if path is None or path.exists():
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:  # another process created it first: theirs is used as it is
        return
    os.close(fd)


def db_file(db: Database) -> Path | None:
    """The SQLite file behind a database URL, when there is one (a `file:` URI is SQLite's)."""
    return sqlite_file(db.url)


def _check_sqlite_header(path: Path) -> None:
    """Refuse a file that is not an SQLite database, before SQLite may touch it."""
    try:
        with path.open("rb") as handle:
            header = handle.read(16)
    except OSError as exc:
        raise UnreadableDatabaseError() from exc
    if header and header != b"SQLite format 3\x00":
        raise UnreadableDatabaseError()


def _upgrade_in_txn(db: Database, target: str = "head") -> None:
    from alembic import command  # lazy: alembic only for a migration

    try:
        with db.engine.connect() as conn:
            conn.execution_options(ledger_write=True)
            with db.write_lock.held(), conn.begin():  # a migration is a write: it queues too
                command.upgrade(alembic_config(conn), target)
                _record_meta(conn, db)
    except (exc.DBAPIError, sqlite_driver.Error) as error:
        raise translate(error) from error


def _record_meta(conn: Connection, db: Database) -> None:
    """The library that last migrated the file. The journal mode is not stored: it follows from
    the library in use (R-DB-3a), and a stored one went stale when the rollback mode changed."""
    conn.execute(meta.delete().where(meta.c.key.in_(("journal_mode", "sqlite_version"))))
    if db.is_sqlite:  # the library version is a SQLite fact
        version = sqlite_driver.library_version()
        conn.execute(meta.insert().values(key="sqlite_version", value=version))


def open_checked(db: Database, *, create: bool = True) -> str:
    """Make sure the schema is usable: create a new database at head, refuse old or new ones.

    With `create=False` (a read) an empty database is left empty (`NoLedgerError`): on
    PostgreSQL a read pointed at the wrong, existing database must not create the ledger there.
    """
    path = db_file(db)
    if path is not None:
        if path.exists():
            _check_sqlite_header(path)
        else:
            _prepare_file(db)
    revision, empty = _revision_while_moving(db)
    head = head_revision()
    if revision is None:
        if not empty:
            raise UnreadableDatabaseError()
        if not create:
            raise NoLedgerError()
        _upgrade_in_txn(db)
        if path is not None:
            secure_file(path)
        return head
    if revision == head:
        return head
    if revision in known_revisions():
        raise SchemaTooOldError()
    raise SchemaTooNewError()


def _revision_while_moving(db: Database) -> tuple[str | None, bool]:
    """The stored revision and whether the database is empty, read in one short transaction.

    On SQLite's rollback journal a reader needs SHARED, refused while any writer commits, and
    SQLite's busy handler gives up after a busy timeout *in total* while newcomers overtake it:
    every `ledger` process's first read, starved behind a burst of writers that keeps the write
    lock changing hands (96 cron jobs on a loaded machine). As for writers (R-DB-3), `busy` only
    once the write lock has not changed hands for a whole busy timeout: the read is tried again
    while its turn counter moves (issue 29 item 11); reading changes nothing.
    """
    before = db.write_lock.turns()
    while True:
        try:
            with db.read() as conn:
                revision = read_revision(conn)
                return revision, revision is None and not _has_tables(conn)
        except BusyError:
            now = db.write_lock.turns()
            if now is None or now == before:
                raise
            before = now


def backup_sqlite(path: Path, revision: str, now: datetime | None = None) -> Path:
    """Copy the database with SQLite's online backup API to
    ledger.db.bak-<rev>-<UTC stamp to the microsecond>[-N], a name no other backup has (two
    upgrades at once each get their own). A directory that refuses the copy is a StoreError."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S.%fZ")
    base = f"{path.name}.bak-{revision}-{stamp}"
    try:
        target = _new_private_file(path.parent, base)
        src = sqlite_driver.connect(path)
        dst = sqlite_driver.connect(target)
        try:
            with dst:
                src.backup(dst)
        finally:
            dst.close()
            src.close()
    except OSError as exc:
        raise _os_error(exc) from exc
    except sqlite_driver.Error as exc:
        raise translate(exc) from exc
    secure_file(target)
    return target


def _new_private_file(directory: Path, name: str) -> Path:
    """Create `name` (else `name-2`, `name-3`, …) 0600 with O_EXCL: never another's file."""
    for n in range(1, 1000):
        target = directory / (name if n == 1 else f"{name}-{n}")
        try:
            fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            continue
        os.close(fd)
        return target
    raise StoreError("no free backup name beside the database; nothing was changed")


def _os_error(exc: OSError) -> StoreError:
    """The ledger's one line for a file the store could not write (never the OS text)."""
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ReadOnlyError()
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFullError()
    return StoreError("a file beside the database could not be written; nothing was changed")


def upgrade(db: Database, target: str = "head") -> tuple[str | None, str, Path | None]:
    """Back up an existing SQLite file, then migrate; returns (from, to, backup path).

    A database already at the newest revision is left as it is: no backup, no write."""
    path = db_file(db)
    backup: Path | None = None
    if path is not None and path.exists():
        _check_sqlite_header(path)
    before: str | None = None
    if path is None or path.exists():
        with db.read() as conn:
            before = read_revision(conn)
            # tables but no ledger revision: another application's database (`--db` pointed at
            # the wrong one); nothing is added to it
            foreign = before is None and _has_tables(conn)
        if foreign:
            raise UnreadableDatabaseError()
    if before is not None and before not in known_revisions():
        raise SchemaTooNewError()
    if before is not None and before == (head_revision() if target == "head" else target):
        return before, before, None
    if path is not None and path.exists() and path.stat().st_size > 0 and before is not None:
        backup = backup_sqlite(path, before)
    try:
        _prepare_file(db)
    except OSError as exc:
        raise _os_error(exc) from exc
    _upgrade_in_txn(db, target)
    if path is not None:
        secure_file(path)
    return before, current_revision(db) or "", backup


def downgrade(db: Database, target: str) -> None:
    """Migrate down (tests and emergencies)."""
    from alembic import command  # lazy: alembic only for a migration

    with db.engine.connect() as conn:
        conn.execution_options(ledger_write=True)
        with conn.begin():
            command.downgrade(alembic_config(conn), target)


def pragma(db: Database, name: str) -> str:
    """Read one PRAGMA (status shows journal mode, etc.)."""
    if not db.is_sqlite:
        return "n/a"
    with db.engine.connect() as conn:
        value = conn.exec_driver_sql(f"PRAGMA {name}").scalar()  # name is a fixed literal
        conn.rollback()
    return str(value)


def integrity_ok(db: Database) -> bool:
    """PRAGMA integrity_check is ok."""
    with db.engine.connect() as conn:
        return conn.execute(text("PRAGMA integrity_check")).scalar() == "ok"
