"""The revision constants that let `open_checked` skip alembic (R-DB-1, R-DB-4): they must name
exactly the migrations alembic would run, and the plain revision read must agree with alembic's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from ledger.store import Database, migrate


def _db(path: Path) -> Database:
    return Database(f"sqlite:///{path}")


def test_r_db_4_head_revision_is_alembics_single_head() -> None:
    assert migrate.script().get_heads() == [migrate.HEAD_REVISION]
    assert migrate.head_revision() == migrate.HEAD_REVISION


def test_r_db_4_known_revisions_are_every_script_and_every_file() -> None:
    scripts = {rev.revision for rev in migrate.script().walk_revisions()}
    versions = Path(migrate.script().dir) / "versions"
    files = {p.name.split("_", 1)[0] for p in versions.glob("[0-9]*_*.py")}
    assert migrate.known_revisions() == scripts == files == set(migrate.KNOWN_REVISIONS)


@pytest.mark.parametrize("target", ["base", *sorted(migrate.KNOWN_REVISIONS)])
def test_r_db_1_plain_revision_read_matches_alembic(tmp_path: Path, target: str) -> None:
    db = _db(tmp_path / "l.db")
    migrate.open_checked(db)
    if target != migrate.HEAD_REVISION:
        migrate.downgrade(db, target)
    with db.read() as conn:
        expected = MigrationContext.configure(conn).get_current_revision()
        assert migrate.read_revision(conn) == expected
    assert migrate.current_revision(db) == expected
    db.dispose()


def test_r_db_1_no_version_table_reads_as_none(tmp_path: Path) -> None:
    db = _db(tmp_path / "empty.db")
    with db.read() as conn:
        conn.execute(text("SELECT 1"))
        assert migrate.read_revision(conn) is None
    db.dispose()


def test_r_db_4_opening_an_up_to_date_database_does_not_import_alembic(tmp_path: Path) -> None:
    db = _db(tmp_path / "l.db")
    migrate.open_checked(db)
    db.dispose()
    url = f"sqlite:///{tmp_path / 'l.db'}"
    probe = (
        "import sys\n"
        "from ledger.store import Database, migrate\n"
        f"print(migrate.open_checked(Database({url!r})))\n"
        "print(any(m == 'alembic' or m.startswith('alembic.') for m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == [migrate.HEAD_REVISION, "False"]
