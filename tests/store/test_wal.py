"""WAL on a safe bundled SQLite (R-DB-3a, R-DB-3c): the library every opener links, the journal
it picks, the refusal of a WAL file by an affected library, the explicit way back, and readers
that never wait for a writer."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ledger.api import Ledger
from ledger.cli.main import cli
from ledger.store import sqlite_driver
from ledger.store.engine import UnsafeWalError, chosen_journal_mode, wal_is_safe
from tests.support.ledgers import AFFECTED_SQLITE, write_policy

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = sqlite_driver.LIBRARY == "pysqlite3"
STDLIB_AFFECTED = not wal_is_safe(__import__("sqlite3").sqlite_version)


def needs_bundled() -> None:
    """Skip where no wheel bundles a safe SQLite; CI (Linux x86_64) always has one."""
    if not BUNDLED:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must install the pysqlite3 wheel (pyproject's platform marker)")
        pytest.skip("no pysqlite3 wheel on this platform: the rollback journal is the fallback")


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def run_cli(home: Path, *args: str, stdlib: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LEDGER_SQLITE", None)
    if stdlib:
        env["LEDGER_SQLITE"] = "stdlib"
    return subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def file_journal(home: Path) -> str:
    conn = sqlite_driver.connect(home / "ledger.db", isolation_level=None)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    finally:
        conn.close()


def turn_to_wal(home: Path) -> None:
    conn = sqlite_driver.connect(home / "ledger.db", isolation_level=None)
    try:
        assert conn.execute("PRAGMA journal_mode = wal").fetchone()[0] == "wal"
    finally:
        conn.close()


def content(home: Path) -> str:
    """The committed content, whatever the journal (a WAL's frames included)."""
    conn = sqlite_driver.connect(home / "ledger.db", isolation_level=None)
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        rows = [(t, sorted(map(repr, conn.execute(f'SELECT * FROM "{t}"')))) for t in tables]
        return hashlib.sha256(repr(rows).encode()).hexdigest()
    finally:
        conn.close()


@contextmanager
def exclusive_writer(home: Path) -> Iterator[None]:
    """Another process inside a write transaction that has written and holds SQLite's
    exclusive lock (as a writer does while it commits), until the block ends."""
    script = (
        "import sys\n"
        "from ledger.store import sqlite_driver\n"
        "c = sqlite_driver.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE')\n"
        "c.execute(\"UPDATE sources SET failures = failures WHERE 0\")\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
        "c.execute('ROLLBACK')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(home / "ledger.db")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.communicate("", timeout=60)


def test_r_db_3c_a_default_install_links_the_bundled_library_and_runs_wal(home: Path) -> None:
    needs_bundled()
    assert wal_is_safe(sqlite_driver.library_version())
    led = Ledger.open(home, env={})
    led.reserve("s1", "alpha/small")
    assert led.db.journal_mode == "wal"
    led.close()
    assert file_journal(home) == "wal"  # a property of the file, seen by any connection


def test_r_db_3c_a_rollback_file_from_an_older_install_turns_wal_when_opened(home: Path) -> None:
    needs_bundled()
    conn = sqlite_driver.connect(home / "ledger.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = truncate")
    conn.close()
    Ledger.open(home, env={}).close()  # builds the schema on the rollback file, then converts
    assert file_journal(home) == "wal"


def test_r_db_3c_an_affected_library_refuses_a_wal_file_and_changes_nothing(
    home: Path, rollback_journal: str
) -> None:
    Ledger.open(home, env={}).close()
    turn_to_wal(home)
    before = content(home)
    with pytest.raises(UnsafeWalError) as refused:
        Ledger.open(home, env={}).reserve("s1", "alpha/small")
    assert rollback_journal in refused.value.message
    assert "ledger db journal truncate" in refused.value.message
    result = invoke(home, "status")
    assert result.exit_code == 2
    assert result.output.splitlines() == [f"ledger: {refused.value.message}"]
    assert file_journal(home) == "wal"  # never turned back as a side effect
    assert content(home) == before


def test_r_db_3c_a_pooled_connection_finds_the_file_turned_wal_since_it_opened(
    home: Path, rollback_journal: str
) -> None:
    """A safe process elsewhere may turn the file to WAL while this (affected) one has pooled
    connections open in the rollback journal: the next transaction refuses, nothing written."""
    led = Ledger.open(home, env={})
    led.reserve("s1", "alpha/small")
    assert led.db.journal_mode == "truncate"
    turn_to_wal(home)
    before = content(home)
    with pytest.raises(UnsafeWalError):
        led.reserve("s2", "alpha/small")
    led.close()
    assert content(home) == before


def test_r_db_3c_db_journal_truncate_is_the_explicit_way_back(
    home: Path, rollback_journal: str
) -> None:
    Ledger.open(home, env={}).close()
    turn_to_wal(home)
    shown = invoke(home, "db", "journal", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output) == {
        "library": sqlite_driver.LIBRARY,
        "sqlite_version": AFFECTED_SQLITE,
        "wal_safe": False,
        "journal": "wal",
        "ledger_opens_it_in": "truncate",
    }
    back = invoke(home, "db", "journal", "truncate")
    assert back.exit_code == 0, back.output
    assert "journal: rollback; the ledger opens it in truncate" in back.output
    assert file_journal(home) != "wal"
    led = Ledger.open(home, env={})
    assert led.reserve("s1", "alpha/small").id == 1
    led.close()
    refused = invoke(home, "db", "journal", "wal")  # WAL needs a safe library
    assert refused.exit_code == 2
    assert "WAL-reset bug" in refused.output
    assert file_journal(home) != "wal"


def test_r_db_3c_db_journal_on_an_empty_home_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "state"
    shown = invoke(home, "db", "journal", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["journal"] is None
    assert invoke(home, "db", "journal", "truncate").exit_code == 4
    assert not (home / "ledger.db").exists()


@pytest.mark.skipif(not STDLIB_AFFECTED, reason="this machine's system SQLite is not affected")
def test_r_db_3c_a_process_on_the_system_library_refuses_the_wal_file(home: Path) -> None:
    """The real thing, two libraries in two processes: the bundled one made the file WAL; a
    process told to link the standard library's (affected) SQLite exits 2 naming it."""
    needs_bundled()
    Ledger.open(home, env={}).close()
    before = content(home)
    result = run_cli(home, "status", stdlib=True)
    assert result.returncode == 2, result.stderr
    version = __import__("sqlite3").sqlite_version
    assert result.stderr.splitlines() == [
        f"ledger: the database is in WAL mode and this process links SQLite {version} (sqlite3), "
        "which has the WAL-reset bug: run it where the pysqlite3 wheel is installed, or turn the "
        "file back to the rollback journal with `ledger db journal truncate`"
    ]
    assert content(home) == before
    back = run_cli(home, "db", "journal", "truncate", stdlib=True)
    assert back.returncode == 0, back.stderr
    assert run_cli(home, "status", "--json", stdlib=True).returncode == 0
    assert run_cli(home, "status", "--json").returncode == 0  # the bundled one turns it WAL again
    assert file_journal(home) == "wal"


def test_r_db_3c_readers_never_wait_for_a_writer_in_wal(home: Path) -> None:
    """Item 2 of the storage issue: with a writer holding SQLite's exclusive lock (mid-commit),
    `ledger status` reads at once in WAL; on the rollback journal the same read is busy."""
    needs_bundled()
    write_policy(home, busyTimeoutMs=200)
    led = Ledger.open(home, env={})
    led.reserve("s1", "alpha/small")
    led.close()
    with exclusive_writer(home):
        result = invoke(home, "status", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["store"]["journal_mode"] == "wal"


@pytest.mark.usefixtures("rollback_journal")
def test_r_db_3_on_the_rollback_journal_a_reader_behind_an_exclusive_writer_is_busy(
    home: Path,
) -> None:
    """The contrast that makes the WAL test mean something (same setup, rollback journal)."""
    write_policy(home, busyTimeoutMs=200)
    led = Ledger.open(home, env={})
    led.reserve("s1", "alpha/small")
    led.close()
    assert chosen_journal_mode() == "truncate"
    with exclusive_writer(home):
        result = invoke(home, "status", "--json")
    assert result.exit_code == 4, result.output


def test_r_db_3c_nothing_opens_a_ledger_file_with_another_library() -> None:
    """Two SQLite libraries on one WAL file read each other's work as a malformed image: every
    opener in the project (package, tests, bench, scripts) goes through `sqlite_driver`."""
    others = [
        str(path.relative_to(ROOT))
        for folder in ("ledger", "tests", "bench", "scripts", "migrations")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "sqlite_driver.py" and "sqlite3.connect(" in path.read_text()
        and path.name != "test_wal.py"
    ]
    assert others == []
