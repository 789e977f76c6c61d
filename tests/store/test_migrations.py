"""R-DB-1, R-DB-4, R-DB-5: migrations are the schema; old/new refused; upgrade backs up first."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import inspect

from ledger.cli.main import cli
from ledger.errors import SchemaTooOldError, UnreadableDatabaseError
from ledger.store import Database, migrate, sqlite_driver
from ledger.store.schema import metadata
from tests.support.backends import BACKENDS
from tests.support.ledgers import T0


def _db(path: Path) -> Database:
    return Database(f"sqlite:///{path}")


def test_r_db_1_single_head() -> None:
    assert len(migrate.script().get_heads()) == 1


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_db_1_base_to_head_then_no_autogenerate_drift(
    tmp_path: Path, ledger_db: str | None
) -> None:
    db = Database(ledger_db) if ledger_db else _db(tmp_path / "l.db")
    assert migrate.open_checked(db) == migrate.head_revision()
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    db.dispose()
    assert diff == []


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_db_1_down_and_up_through_every_revision(tmp_path: Path, ledger_db: str | None) -> None:
    db = Database(ledger_db) if ledger_db else _db(tmp_path / "l.db")
    migrate.open_checked(db)
    revisions = [r.revision for r in migrate.script().walk_revisions()]  # head first
    for rev in revisions[1:]:
        migrate.downgrade(db, rev)
        assert migrate.current_revision(db) == rev
    migrate.downgrade(db, "base")
    assert migrate.current_revision(db) is None
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.head_revision()
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    db.dispose()
    assert diff == []


def test_r_db_4_new_database_created_at_head_with_0600(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    migrate.open_checked(_db(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_r_db_4_older_schema_refused_with_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "h"
    home.mkdir()
    migrate.open_checked(_db(home / "ledger.db"))
    current = migrate.head_revision()
    # this code "knows" a newer head: the database's known revision is now older than head
    monkeypatch.setattr(migrate, "head_revision", lambda: "9999_newer")
    monkeypatch.setattr(migrate, "known_revisions", lambda: {current, "9999_newer"})
    with pytest.raises(SchemaTooOldError):
        migrate.open_checked(_db(home / "ledger.db"))
    result = CliRunner().invoke(cli, ["--home", str(home), "status"])
    assert result.exit_code == 4
    assert "ledger db upgrade" in result.output


def test_r_db_4_empty_after_downgrade_is_rebuilt(tmp_path: Path) -> None:
    db = _db(tmp_path / "l.db")
    migrate.open_checked(db)
    migrate.downgrade(db, "base")
    assert migrate.open_checked(db) == migrate.head_revision()


def test_r_db_4_newer_schema_refused_exit_4_and_untouched(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    path = home / "ledger.db"
    migrate.open_checked(_db(path))
    with sqlite_driver.connect(path) as raw:
        raw.execute("UPDATE alembic_version SET version_num = 'ffff_from_the_future'")
    before = path.read_bytes()
    for args in (["status"], ["db", "upgrade"], ["reserve", "s", "--model", "alpha/small"]):
        result = CliRunner().invoke(cli, ["--home", str(home), *args])
        assert result.exit_code == 4, (args, result.output)
        assert "newer" in result.output
    assert path.read_bytes() == before


def test_r_db_4_garbage_file_refused_and_never_modified(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    path = home / "ledger.db"
    path.write_bytes(b"this is not a database at all" * 100)
    before = path.read_bytes()
    with pytest.raises(UnreadableDatabaseError):
        migrate.open_checked(_db(path))
    result = CliRunner().invoke(cli, ["--home", str(home), "status"])
    assert result.exit_code == 4
    result = CliRunner().invoke(cli, ["--home", str(home), "db", "upgrade"])
    assert result.exit_code == 4
    assert path.read_bytes() == before
    assert sorted(p.name for p in home.iterdir()) == ["ledger.db"]


def test_r_db_3a_meta_records_the_library_not_a_journal_mode(tmp_path: Path) -> None:
    """The journal mode follows from the library in use; a stored one (older ledgers wrote
    `delete`) would go stale, so a migration removes it and records only the library."""
    path = tmp_path / "ledger.db"
    migrate.upgrade(_db(path), "0002")
    with sqlite_driver.connect(path) as raw:  # what an older ledger left behind
        raw.execute("UPDATE meta SET value = 'delete' WHERE key = 'journal_mode'")
        raw.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('journal_mode', 'delete')")
    migrate.upgrade(_db(path))
    with sqlite_driver.connect(path) as raw:
        stored = dict(raw.execute("SELECT key, value FROM meta").fetchall())
    assert "journal_mode" not in stored
    assert stored["sqlite_version"] == sqlite_driver.library_version()  # the linked library


def test_r_db_5_upgrade_backs_up_first_and_backup_restores(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    path = home / "ledger.db"
    db = _db(path)
    migrate.open_checked(db)
    migrate.downgrade(db, "0002")  # an older ledger's database (at head nothing is backed up)
    with sqlite_driver.connect(path) as raw:
        raw.execute("INSERT INTO meta (key, value) VALUES ('marker', 'kept')")
    result = CliRunner().invoke(cli, ["--home", str(home), "db", "upgrade"])
    assert result.exit_code == 0, result.output
    backups = list(home.glob("ledger.db.bak-*"))
    assert len(backups) == 1
    assert backups[0].name.startswith("ledger.db.bak-0002-")
    assert str(backups[0]) in result.output
    assert stat.S_IMODE(backups[0].stat().st_mode) == 0o600
    with sqlite_driver.connect(backups[0]) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("SELECT value FROM meta WHERE key='marker'").fetchone()[0] == "kept"


def test_r_db_5_db_current(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "db", "upgrade"])
    assert result.exit_code == 0
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "db", "current"])
    assert result.exit_code == 0
    assert migrate.head_revision() in result.output


def test_issue12_item6_0003b_adds_follow_up_columns_and_keeps_data(tmp_path: Path) -> None:
    from ledger.api import Ledger
    from ledger.catalog import Catalog
    from ledger.errors import Refused
    from tests.support.ledgers import T0, TEST_CATALOG, Clock

    path = tmp_path / "ledger.db"
    db = _db(path)
    migrate.upgrade(db, "0002")
    with sqlite_driver.connect(path) as raw:
        raw.execute(
            "INSERT INTO sources (id, state, created_ms, last_checked_ms, retry_at_ms, failures)"
            f" VALUES ('src', 'queued', {T0}, {T0}, {T0 + 60_000}, 1)"
        )
        raw.execute(
            "INSERT INTO reservations (source_id, model_key, provider, role, created_ms,"
            " deadline_ms, input_bytes, estimate_micro, status, kind, cost_micro, policy_fp)"
            f" VALUES ('src', 'alpha/small', 'alpha', 'primary', {T0}, {T0 + 1000}, 10, 7,"
            " 'failed', 'transport', 7, 'fp')"
        )
    db.dispose()
    db = _db(path)
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.head_revision()
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        query = "SELECT id, follow_up, after_id, cost_micro FROM reservations"
        rows = raw.execute(query).fetchall()
    assert rows == [(1, None, None, 7)]  # a failure from before the upgrade permits no follow-up
    led = Ledger.open(
        tmp_path, catalog=Catalog.model_validate(TEST_CATALOG), env={}, clock=Clock(T0 + 1)
    )
    try:
        with pytest.raises(Refused) as info:
            led.reserve("src", "beta/mid", after=1)
        assert info.value.reason == "source_backoff"
    finally:
        led.close()
    db = _db(path)
    migrate.downgrade(db, "0002")
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        columns = {r[1] for r in raw.execute("PRAGMA table_info(reservations)")}
        kept = raw.execute("SELECT id, status, cost_micro FROM reservations").fetchall()
    assert "follow_up" not in columns
    assert "after_id" not in columns
    assert kept == [(1, "failed", 7)]
def test_issue20_item4_0004_adds_cached_token_columns_and_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    db = _db(path)
    migrate.upgrade(db, "0003b")
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        raw.execute(
            "INSERT INTO sources (id, state, created_ms, last_checked_ms)"
            f" VALUES ('src', 'queued', {T0}, {T0})"
        )
        raw.execute(
            "INSERT INTO reservations (source_id, model_key, provider, role, created_ms,"
            " deadline_ms, input_bytes, estimate_micro, status, input_tokens, output_tokens,"
            " actual_micro, cost_micro, policy_fp)"
            f" VALUES ('src', 'alpha/small', 'alpha', 'primary', {T0}, {T0 + 1000}, 10, 7,"
            " 'succeeded', 11, 12, 5, 5, 'fp')"
        )
        raw.execute(
            "INSERT INTO daily_totals (day, model_key, attempts, succeeded, failed, cancelled,"
            " expired, input_tokens, output_tokens, cost_micro, unknown_cost)"
            " VALUES ('2027-01-01', 'alpha/small', 1, 1, 0, 0, 0, 3, 4, 5, 0)"
        )
    db = _db(path)
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.HEAD_REVISION
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        rows = raw.execute(
            "SELECT input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, cost_micro"
            " FROM reservations"
        ).fetchall()
        totals = raw.execute(
            "SELECT input_tokens, cache_write_tokens, cache_read_tokens FROM daily_totals"
        ).fetchall()
    assert rows == [(11, 12, None, None, 5)]  # usage from before the upgrade: cache unknown
    assert totals == [(3, 0, 0)]
    status = CliRunner().invoke(cli, ["--home", str(tmp_path), "status", "--json"])
    (day,) = json.loads(status.output)["history"]
    assert (day["input_tokens"], day["cache_write_tokens"], day["cache_read_tokens"]) == (3, 0, 0)
    db = _db(path)
    migrate.downgrade(db, "0003b")
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        columns = {r[1] for r in raw.execute("PRAGMA table_info(reservations)")}
        total_columns = {r[1] for r in raw.execute("PRAGMA table_info(daily_totals)")}
        kept = raw.execute("SELECT input_tokens, cost_micro FROM reservations").fetchall()
        kept_totals = raw.execute("SELECT input_tokens, cost_micro FROM daily_totals").fetchall()
    assert not {"cache_write_tokens", "cache_read_tokens"} & (columns | total_columns)
    assert kept == [(11, 5)]
    assert kept_totals == [(3, 5)]


def test_issue24_0005_arms_running_policy_cooldowns_and_keeps_data(tmp_path: Path) -> None:
    from ledger.api import Ledger
    from ledger.catalog import Catalog
    from ledger.errors import Refused
    from tests.support.ledgers import T0, TEST_CATALOG, Clock

    path = tmp_path / "ledger.db"
    db = _db(path)
    migrate.upgrade(db, "0003b")
    with sqlite_driver.connect(path) as raw:
        raw.execute(f"INSERT INTO clock (id, newest_ms) VALUES (1, {T0})")
        raw.executemany(
            "INSERT INTO cooldowns (scope, target, origin, until_ms, kind, created_ms)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                ("model", "alpha/small", "policy", T0 + 60_000, "rate_limit", T0),  # running
                ("provider", "beta", "manual", T0 + 60_000, "manual", T0),  # manual: no probe
                ("model", "gamma/g1", "hint", T0 - 1, "rate_limit", T0 - 9),  # ended: no probe
            ],
        )
    db.dispose()
    db = _db(path)
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.HEAD_REVISION
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        armed = raw.execute("SELECT scope, target, streak, holder_id FROM probes").fetchall()
        kept = raw.execute("SELECT COUNT(*) FROM cooldowns").fetchone()
    assert armed == [("model", "alpha/small", 0, None)]
    assert kept == (3,)
    led = Ledger.open(
        tmp_path, catalog=Catalog.model_validate(TEST_CATALOG), env={}, clock=Clock(T0 + 60_000)
    )
    try:
        led.reserve("a", "alpha/small")  # the cooldown from before the upgrade ends in a probe
        with pytest.raises(Refused) as info:
            led.reserve("b", "alpha/small")
        assert info.value.reason == "probing"
    finally:
        led.close()
    db = _db(path)
    migrate.downgrade(db, "0003b")
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        count = raw.execute("SELECT COUNT(*) FROM reservations").fetchone()
    assert "probes" not in tables
    assert count == (1,)


SQLITE_SCHEMA_0002 = Path(__file__).with_name("sqlite_schema_0002.sql")


def _sqlite_schema(path: Path) -> str:
    with sqlite_driver.connect(path) as raw:
        found = raw.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name"
        ).fetchall()
    return "\n".join(f"-- {kind} {name}\n{sql};\n" for kind, name, sql in found)


def test_issue16_item1_portable_revisions_leave_the_sqlite_schema_byte_identical(
    tmp_path: Path,
) -> None:
    # Revisions 0001/0002 became dialect-neutral for PostgreSQL (boolean defaults); SQLite must
    # get exactly the DDL it got before (the file was written by the revisions before the change).
    path = tmp_path / "l.db"
    db = _db(path)
    migrate.upgrade(db, "0002")
    db.dispose()
    assert _sqlite_schema(path) == SQLITE_SCHEMA_0002.read_text()


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_db_4_upgrade_never_moves_into_another_applications_database(
    tmp_path: Path, ledger_db: str | None
) -> None:
    # `--db` pointed at an application's existing database (e.g. …/postgres, or an app's SQLite
    # file): `db upgrade` refuses like every other command and adds no table to it.
    url = ledger_db or f"sqlite:///{tmp_path / 'other.db'}"
    db = Database(url)
    with db.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE other_app (x INTEGER)")
    with pytest.raises(UnreadableDatabaseError):
        migrate.upgrade(db)
    with db.engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
    db.dispose()
    assert tables == {"other_app"}
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "--db", url, "db", "upgrade"])
    assert result.exit_code == 4, result.output
    assert "not a ledger database" in result.output
