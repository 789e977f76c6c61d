"""R-HOME-1, R-DB-5, SPEC 15 security: private files, parameterised SQL, no silent symlink hops.

The state directory is 0700 and every database file (the backup too) 0600 whatever the umask;
hostile source and request ids round-trip as plain data; a `--home` symlink into another user's
directory is announced.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ledger.api import Ledger
from ledger.cli.main import cli
from ledger.home import symlink_warning
from ledger.store import Database, migrate, sqlite_driver
from ledger.store.engine import chosen_journal_mode
from tests.support.ledgers import TEST_CATALOG

HOSTILE = ["x'); DROP TABLE sources;--", 'a" OR "1"="1', "%_\\'; DELETE FROM reservations; --"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask, so only the ledger's own modes protect the files."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
def test_r_home_1_new_state_directory_0700_and_database_0600(tmp_path: Path) -> None:
    home = tmp_path / "deep" / "state"
    Ledger.open(home, env={}).close()
    assert mode(home) == 0o700
    assert mode(home / "ledger.db") == 0o600
    assert mode(home / "ledger.db-writelock") == 0o600  # issue 14: the write lock beside it
    cli_home = tmp_path / "cli-state"
    assert invoke(cli_home, "source", "add", "s1").exit_code == 0
    assert mode(cli_home) == 0o700
    assert mode(cli_home / "ledger.db") == 0o600


@pytest.mark.usefixtures("open_umask")
@pytest.mark.parametrize("journal", ["default", "rollback"])
def test_r_db_5_upgrade_and_its_backup_stay_private(
    tmp_path: Path, journal: str, request: pytest.FixtureRequest
) -> None:
    if journal == "rollback":
        request.getfixturevalue("rollback_journal")
    home = tmp_path / "state"
    assert invoke(home, "source", "add", "s1").exit_code == 0
    old = Database(f"sqlite:///{home / 'ledger.db'}")
    migrate.downgrade(old, "0002")  # at head nothing is backed up (issue 20 item 12)
    old.dispose()
    result = invoke(home, "db", "upgrade", "--json")
    assert result.exit_code == 0, result.output
    backup = Path(json.loads(result.stdout)["backup"])
    assert backup.parent == home
    assert mode(backup) == 0o600
    assert mode(home / "ledger.db") == 0o600
    assert mode(home) == 0o700
    # the lock file (issue 14) and the truncated rollback journal (durable commits, R-DB-3);
    # in WAL mode the -wal and -shm files live only while a connection is open
    journal_file = ["ledger.db-journal"] if chosen_journal_mode() == "truncate" else []
    names = ["ledger.db", *journal_file, "ledger.db-writelock", backup.name]
    assert sorted(p.name for p in home.iterdir()) == sorted(names)
    for path in home.iterdir():
        assert mode(path) == 0o600


@pytest.mark.parametrize("hostile", HOSTILE)
def test_spec_15_hostile_ids_round_trip_as_data(tmp_path: Path, hostile: str) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    reserved = invoke(home, "reserve", hostile, "--model", "alpha/small", "--request-id", hostile,
                      "--json")
    assert reserved.exit_code == 0, reserved.output
    doc = json.loads(reserved.stdout)
    assert (doc["source"], doc["request_id"]) == (hostile, hostile)
    settled = invoke(home, "settle", str(doc["id"]), "--ok", "--input-tokens", "5",
                     "--output-tokens", "5", "--json")
    assert settled.exit_code == 0, settled.output
    again = invoke(home, "reserve", hostile, "--model", "alpha/small", "--request-id", hostile,
                   "--json")
    assert json.loads(again.stdout)["replayed"] is True
    shown = invoke(home, "source", "show", hostile, "--json")
    assert shown.exit_code == 0, shown.output
    detail = json.loads(shown.stdout)
    assert detail["id"] == hostile
    assert [a["status"] for a in detail["attempts"]] == ["succeeded"]
    listed = json.loads(invoke(home, "source", "list", "--json").stdout)
    assert [s["id"] for s in listed["sources"]] == [hostile]
    with sqlite_driver.connect(home / "ledger.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"sources", "reservations", "cooldowns"} <= tables
        assert conn.execute("SELECT id FROM sources").fetchall() == [(hostile,)]
        assert conn.execute("SELECT count(*) FROM reservations").fetchone()[0] == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a directory to another uid")
def test_r_home_1_symlink_into_another_users_directory_is_announced(tmp_path: Path) -> None:
    other = tmp_path / "other-user-state"
    other.mkdir(mode=0o700)
    (other / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    os.chown(other, 12345, 12345)
    link = tmp_path / "state-link"
    link.symlink_to(other)
    assert symlink_warning(link) is not None
    result = invoke(link, "source", "list")
    assert result.stderr.splitlines()[0] == (
        "warning: the state directory is a symlink into a directory owned by another user"
    )


def test_r_home_1_symlink_into_own_directory_is_quiet(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert symlink_warning(link) is None
    result = invoke(link, "source", "add", "s1")
    assert result.exit_code == 0
    assert result.stderr == ""
