"""A database file replaced under a running service is noticed (R-SRV-10, issue 29 item 6).

A real `ledger serve` subprocess; the file is replaced as an operator restoring a copy would
(`os.replace` of a consistent copy onto `ledger.db`) or moved away. Before: every reserve then
answered `503 ReadOnlyError` (the wrong cause), `/readyz` stayed 200, and CLI processes wrote the
new file while the service's status was stale."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from ledger.client import LedgerClient
from ledger.store import sqlite_driver
from ledger.store.engine import wal_is_safe
from tests.support.backends import rows
from tests.support.ledgers import write_policy
from tests.support.serving import running


def _copy(db: Path, to: Path) -> None:
    """A consistent copy of a live SQLite database (the backup API)."""
    source = sqlite_driver.connect(db)
    target = sqlite_driver.connect(to)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()


def _sources(db: Path) -> list[str]:
    return sorted(r[0] for r in rows(f"sqlite:///{db}", "SELECT source_id FROM reservations"))


STDLIB_WAL_SAFE = wal_is_safe(sqlite3.sqlite_version)
ROLLBACK_ENV = {"LEDGER_SQLITE": "stdlib"}  # the system library: affected, so the rollback journal


@pytest.mark.skipif(STDLIB_WAL_SAFE, reason="the system SQLite is not affected: no rollback mode")
def test_r_srv_10_a_replaced_database_file_is_reopened(home: Path) -> None:
    """On the rollback journal the file is the whole database: the copy is reopened."""
    write_policy(home, callsPerHour=1000)
    db = home / "ledger.db"
    with running(home, env=ROLLBACK_ENV) as served, LedgerClient(served.socket) as client:
        client.reserve("before-copy", "alpha/small")
        _copy(db, home / "restored.db")
        client.reserve("only-in-the-old-file", "alpha/small")
        os.replace(home / "restored.db", db)
        after = client.reserve("after-restore", "alpha/small")  # before: 503 ReadOnlyError
        assert after.id > 0
        with served.client() as http:
            ready = http.get("/readyz")
            assert ready.status_code == 200, ready.text
            status = http.get("/v1/status").json()
        assert _sources(db) == ["after-restore", "before-copy"]  # the file at the path
        assert status["hourly"]["used"] == 2  # the status speaks of that file, not the old one
    assert any("was replaced" in line for line in served.log)


@pytest.mark.skipif(not wal_is_safe(sqlite_driver.library_version()), reason="no WAL here")
def test_r_db_3c_a_file_replaced_under_a_wal_service_is_refused_never_mixed(home: Path) -> None:
    """In WAL mode the `-wal` beside the path holds the old file's frames: the service does
    not open the copy (SQLite would read those frames as its pages) and says why."""
    write_policy(home, callsPerHour=1000)
    db = home / "ledger.db"
    with running(home) as served, LedgerClient(served.socket) as client:
        client.reserve("before-copy", "alpha/small")
        _copy(db, home / "restored.db")
        client.reserve("only-in-the-old-file", "alpha/small")
        os.replace(home / "restored.db", db)
        with served.client() as http:
            reserve = http.post("/v1/reserve", json={"source": "s", "model": "alpha/small"})
            assert reserve.status_code == 503
            message = reserve.json()["error"]["message"]
            assert "WAL mode" in message
            assert "stop every ledger process" in message
            assert http.get("/readyz").status_code == 503
            assert http.get("/healthz").status_code == 200


def test_r_srv_10_a_database_file_gone_from_its_path_makes_readyz_503(home: Path) -> None:
    db = home / "ledger.db"
    with running(home) as served, served.client() as http:
        assert http.get("/readyz").status_code == 200
        os.replace(db, home / "moved-away.db")
        ready = http.get("/readyz")  # before: 200
        assert ready.status_code == 503
        error = ready.json()["error"]
        assert error["code"] == "not_ready"
        assert str(db) in error["message"]
        assert "gone" in error["message"]
        reserve = http.post("/v1/reserve", json={"source": "s", "model": "alpha/small"})
        assert reserve.status_code == 503
        assert reserve.json()["error"]["code"] == "database_gone"  # never ReadOnlyError
        assert http.get("/healthz").status_code == 200  # the process still answers
        os.replace(home / "moved-away.db", db)  # put back: ready again
        assert http.get("/readyz").status_code == 200
