"""R-DB-3, R-DB-3a, R-DB-3b, SPEC 13/15: storage faults give one clear line and exit 4, never a
partial write; a clock stepping back never rewinds stored time; risky filesystems and SQLite
libraries are recognised.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from freezegun import freeze_time

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.cli.main import cli
from ledger.config import Policy
from ledger.errors import (
    SQLITE_BUSY,
    BusyError,
    ReadOnlyError,
    Refused,
    StorageFullError,
    UnreadableDatabaseError,
)
from ledger.records import Success
from ledger.store import sqlite_driver
from ledger.store.engine import Database, chosen_journal_mode, network_filesystem, wal_is_safe
from tests.support.ledgers import T0, TEST_CATALOG, Clock, LedgerFactory, write_policy
from tests.support.procs import write_lock_held

cli_main = importlib.import_module("ledger.cli.main")  # the package re-exports main()
HOUR = 3_600_000


def invoke(home: Path, *args: str) -> Result:
    """Run the CLI in-process against a state directory."""
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def one_line(result: Result, error: type[Exception]) -> None:
    """Exactly one line on stderr: the error's fixed message."""
    assert result.stderr.splitlines() == [f"ledger: {error().args[0]}"]
    assert result.stdout == ""


def fingerprint(home: Path) -> tuple[str, str, list[str]]:
    """The database bytes' hash, the WAL's (in WAL mode a commit lands there first; absent and
    empty are the same), and the directory listing with each rollback journal's size (no hot
    journal left behind: the truncated rollback journal stays, empty). The WAL index (`-shm`)
    and the WAL file come and go with open connections, so their names are left out."""
    digest = hashlib.sha256((home / "ledger.db").read_bytes()).hexdigest()
    wal = home / "ledger.db-wal"
    frames = wal.read_bytes() if wal.exists() else b""
    return digest, hashlib.sha256(frames).hexdigest(), sorted(
        f"{p.name} {p.stat().st_size}" if p.name.endswith("-journal") else p.name
        for p in home.iterdir()
        if not p.name.endswith(("-wal", "-shm"))
    )


def reservation_count(home: Path) -> int:
    with sqlite_driver.connect(home / "ledger.db") as conn:
        return int(conn.execute("SELECT count(*) FROM reservations").fetchone()[0])


def create(home: Path) -> None:
    """Build the database with the migrations (policy and catalog from the directory)."""
    Ledger.open(home, env={}).close()


# --- busy -----------------------------------------------------------------------------------


def test_r_db_3_write_lock_held_past_busy_timeout_exits_4(home: Path) -> None:
    """SQLite's lock held by a process outside ledger's write lock (a raw BEGIN IMMEDIATE): the
    busy line says it was SQLite's lock, not a ledger writer's turn (tests/store/test_writelock.py
    pins that one), so the operator looks for a shell, a backup or a long reader."""
    write_policy(home, busyTimeoutMs=300)
    create(home)
    before = fingerprint(home)
    with write_lock_held(home / "ledger.db"):
        result = invoke(home, "reserve", "s1", "--model", "alpha/small")
        led = Ledger.open(home, env={})
        with pytest.raises(BusyError, match="SQLite's own lock"):
            led.reserve("s1", "alpha/small")
    assert result.exit_code == 4
    assert result.stderr.splitlines() == [f"ledger: {SQLITE_BUSY}"]
    assert BusyError().message != SQLITE_BUSY
    assert result.stdout == ""
    assert fingerprint(home) == before  # nothing written
    assert led.reserve("s1", "alpha/small").id == 1  # the caller may simply retry
    led.close()


# --- full disk ------------------------------------------------------------------------------


def limit_pages(monkeypatch: pytest.MonkeyPatch, pages: int) -> None:
    """Every new ledger connection may not grow the file past `pages` (a full disk)."""
    original = Database._on_connect

    def on_connect(self: Database, dbapi_conn: Any, record: Any) -> None:
        original(self, dbapi_conn, record)
        dbapi_conn.execute(f"PRAGMA max_page_count = {int(pages)}")

    monkeypatch.setattr(Database, "_on_connect", on_connect)


def test_r_db_3_full_disk_rolls_back_completely_and_exits_4(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_policy(home, callsPerHour=100_000, sourceCalls=100_000)
    create(home)
    with sqlite_driver.connect(home / "ledger.db") as conn:
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    limit_pages(monkeypatch, pages)
    led = Ledger.open(home, env={})
    granted = 0
    for i in range(5000):
        before = fingerprint(home)
        try:
            led.reserve(f"source-{i:05d}", "alpha/small", input_bytes=10)
        except StorageFullError:
            break
        granted += 1
    else:
        pytest.fail("the page limit was never reached")
    led.close()
    assert granted > 0
    assert fingerprint(home) == before  # the failed transaction left no trace, not even a journal
    assert reservation_count(home) == granted
    result = invoke(home, "reserve", f"source-{granted:05d}", "--model", "alpha/small",
                    "--input-bytes", "10")
    assert result.exit_code == 4
    one_line(result, StorageFullError)
    assert fingerprint(home) == before
    monkeypatch.undo()  # space freed: the ledger is usable again, nothing is stuck half-open
    led = Ledger.open(home, env={})
    assert led.reserve(f"source-{granted:05d}", "alpha/small").id == granted + 1
    led.close()
    with sqlite_driver.connect(home / "ledger.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


# --- read-only ------------------------------------------------------------------------------


def test_r_db_3_read_only_uri_exits_4(home: Path) -> None:
    create(home)
    before = fingerprint(home)
    url = f"sqlite:///file:{home / 'ledger.db'}?mode=ro&uri=true"
    result = invoke(home, "--db", url, "reserve", "s1", "--model", "alpha/small")
    assert result.exit_code == 4
    one_line(result, ReadOnlyError)
    assert fingerprint(home) == before


def _can_chattr(path: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        return False
    probe = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    subprocess.run(["chattr", "-i", str(path)], capture_output=True, check=False)
    return probe.returncode == 0


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """`path` (a file or directory) cannot be written for the block: its mode, or `chattr +i`
    as root (modes do not stop root); skips where neither works."""
    if os.geteuid() != 0:
        path.chmod(0o500 if path.is_dir() else 0o400)
    elif not _can_chattr(path):
        pytest.skip("running as root without chattr +i: file modes do not stop root writing")
    else:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o700 if path.is_dir() else 0o600)


@pytest.mark.usefixtures("rollback_journal")
@pytest.mark.parametrize("target", ["file", "directory"])
def test_r_db_3_read_only_file_or_directory_exits_4(home: Path, target: str) -> None:
    create(home)
    path = home / "ledger.db" if target == "file" else home
    if target == "directory":  # no journal file yet: the write needs to create one
        (home / "ledger.db-journal").unlink()
    before = fingerprint(home)
    with read_only(path):
        result = invoke(home, "reserve", "s1", "--model", "alpha/small")
    assert result.exit_code == 4
    one_line(result, ReadOnlyError)
    assert fingerprint(home) == before


@pytest.mark.usefixtures("rollback_journal")
def test_r_db_3_truncate_journal_needs_no_directory_write_once_it_exists(home: Path) -> None:
    """The rollback journal is truncated, not deleted (durable commits): once the journal file
    exists, a commit changes no directory entry, so a read-only directory still takes writes."""
    create(home)
    journal = home / "ledger.db-journal"
    assert journal.is_file()
    assert journal.stat().st_size == 0
    with read_only(home):
        result = invoke(home, "reserve", "s1", "--model", "alpha/small")
    assert result.exit_code == 0, result.output
    assert journal.stat().st_size == 0


def test_r_db_3_read_only_bind_mount_exits_4(home: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True, check=False
    ).returncode != 0:
        pytest.skip("no user/mount namespaces here for a read-only bind mount")
    create(home)
    before = fingerprint(home)
    script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(home),
         sys.executable, "-m", "ledger", "--home", str(home), "reserve", "s1", "--model",
         "alpha/small"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 4
    assert proc.stderr.splitlines() == [f"ledger: {ReadOnlyError().message}"]
    assert fingerprint(home) == before


# --- garbage --------------------------------------------------------------------------------


def _garbage(kind: str, real: bytes) -> bytes:
    rng = random.Random(kind)
    noise = bytes(rng.getrandbits(8) for _ in range(len(real)))
    return {
        "random": noise,
        "zeros": bytes(len(real)),
        "header-then-noise": real[:16] + noise[16:],
        "header-page-then-noise": real[:100] + noise[100:],
    }[kind]


@pytest.mark.parametrize("kind", ["random", "zeros", "header-then-noise", "header-page-then-noise"])
def test_r_db_3_garbage_file_exits_4_and_is_never_touched(home: Path, kind: str) -> None:
    create(home)
    db = home / "ledger.db"
    db.write_bytes(_garbage(kind, db.read_bytes()))
    before, mtime = fingerprint(home), db.stat().st_mtime_ns
    commands = (("reserve", "s1", "--model", "alpha/small"), ("source", "list"), ("db", "upgrade"))
    for args in commands:
        result = invoke(home, *args)
        assert result.exit_code == 4, args
        one_line(result, UnreadableDatabaseError)
    assert fingerprint(home) == before
    assert db.stat().st_mtime_ns == mtime


# --- clock stepping backwards -----------------------------------------------------------------


def test_r_db_3b_clock_backwards_never_rewinds_time_or_reopens_a_slot(
    make_ledger: LedgerFactory, clock: Clock, home: Path
) -> None:
    led = make_ledger(callsPerHour=1)
    first = led.reserve("s1", "alpha/small")
    clock.advance(-2 * HOUR)  # the wall clock jumps back two hours
    with pytest.raises(Refused) as info:
        led.reserve("s2", "alpha/small")
    assert info.value.reason == "shared_hourly_budget"
    assert info.value.retry_at_ms == T0 + HOUR
    settled = led.settle(first.id, Success(10, 10))
    assert settled.late is False
    clock.advance(2 * HOUR + HOUR - 1)  # wall clock back at T0 + 1 h - 1 ms: still spent
    with pytest.raises(Refused):
        led.reserve("s2", "alpha/small")
    clock.advance(2)
    assert led.reserve("s2", "alpha/small").created_ms == T0 + HOUR + 1
    with sqlite_driver.connect(home / "ledger.db") as conn:
        stamps = conn.execute(
            "SELECT created_ms, settled_ms, duration_ms FROM reservations ORDER BY id"
        ).fetchall()
        newest = conn.execute("SELECT newest_ms FROM clock").fetchone()[0]
    assert stamps == [(T0, T0, 0), (T0 + HOUR + 1, None, None)]  # never before T0
    assert newest == T0 + HOUR + 1


def test_r_db_3b_freezegun_wall_clock_backwards(home: Path) -> None:
    with freeze_time("2027-03-01T12:00:00Z") as frozen:
        led = Ledger.open(home, policy=Policy(calls_per_hour=2),
                          catalog=Catalog.model_validate(TEST_CATALOG), env={})
        a = led.reserve("s1", "alpha/small")
        frozen.move_to("2027-03-01T09:00:00Z")
        b = led.reserve("s2", "alpha/small")
        assert b.created_ms == a.created_ms  # stored time holds at the newest value
        frozen.move_to("2027-03-01T12:59:59Z")
        with pytest.raises(Refused) as info:
            led.reserve("s3", "alpha/small")
        assert info.value.reason == "shared_hourly_budget"
        frozen.move_to("2027-03-01T13:00:01Z")
        assert led.reserve("s3", "alpha/small").created_ms > a.created_ms + HOUR
        led.close()


# --- network filesystems, WAL-reset-bug libraries ----------------------------------------------

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
server:/export /mnt/nfs nfs4 rw,vers=4.2 0 0
//srv/share /mnt/smb cifs rw 0 0
//srv/other /mnt/my\\040share smb3 rw 0 0
tmpfs /mnt/nfs/local tmpfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/mnt/nfs/state/ledger.db", "nfs4"),
        ("/mnt/smb/ledger.db", "cifs"),
        ("/mnt/my share/ledger.db", "smb3"),
        ("/mnt/nfs/local/ledger.db", None),  # a local mount inside the NFS tree
        ("/mnt/nfsx/ledger.db", None),  # a prefix is not a mount point
        ("/home/me/ledger.db", None),
    ],
)
def test_r_db_3a_network_filesystem_from_mount_table(
    tmp_path: Path, path: str, expected: str | None
) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    assert network_filesystem(Path(path), mounts) == expected


def test_r_db_3a_cli_warns_on_network_filesystem(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/x {home} nfs rw 0 0\n")
    monkeypatch.setattr(cli_main, "network_filesystem",
                        lambda path: network_filesystem(path, mounts))
    result = invoke(home, "source", "add", "s")
    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        "warning: the database is on a network filesystem (nfs); SQLite locking is not reliable "
        "there"
    ]


@pytest.mark.parametrize(
    ("version", "mode"),
    [
        ("3.7.0", "truncate"),
        ("3.40.1", "truncate"),
        ("3.44.5", "truncate"),
        ("3.44.6", "wal"),
        ("3.45.0", "truncate"),
        ("3.50.6", "truncate"),
        ("3.50.7", "wal"),
        ("3.51.2", "truncate"),
        ("3.51.3", "wal"),
        ("3.52.0", "wal"),
    ],
)
def test_r_db_3a_wal_only_outside_the_reset_bug_range(version: str, mode: str) -> None:
    assert wal_is_safe(version) is (mode == "wal")
    assert chosen_journal_mode(version) == mode


@pytest.mark.parametrize(("version", "mode"), [("3.51.2", "truncate"), ("3.51.3", "wal")])
def test_r_db_3a_patched_library_version_selects_the_journal(
    home: Path, monkeypatch: pytest.MonkeyPatch, version: str, mode: str
) -> None:
    monkeypatch.setattr(sqlite_driver, "library_version", lambda: version)  # what engine reads
    led = Ledger.open(home, env={})
    led.reserve("s1", "alpha/small")
    assert led.db.journal_mode == mode
    with led.db.read() as conn:  # a rollback journal mode belongs to the connection
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == mode
    led.close()
    if mode == "wal":  # WAL is a property of the file, seen by any connection
        with sqlite_driver.connect(home / "ledger.db") as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == mode


def test_r_db_3_pragmas_on_every_ledger_connection(tmp_path: Path) -> None:
    """busy_timeout (policy), foreign_keys=ON, synchronous=FULL, chosen journal mode (R-DB-3)."""
    from ledger.store import Database, migrate
    from ledger.store.engine import chosen_journal_mode

    db = Database(f"sqlite:///{tmp_path / 'l.db'}", busy_timeout_ms=1234)
    migrate.open_checked(db)
    with db.read() as conn:
        values = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("busy_timeout", "foreign_keys", "synchronous", "journal_mode")
        }
    assert values == {
        "busy_timeout": 1234,
        "foreign_keys": 1,
        "synchronous": 2,  # FULL
        "journal_mode": chosen_journal_mode(),
    }
    db.dispose()
