"""Issue 20 item 12 (R-DB-5): `ledger db upgrade` backs up only when it migrates, never collides
on a backup name, and on a read-only mount ends with one line and exit 4."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ledger.cli.main import cli
from ledger.store import Database, migrate


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def old_ledger(home: Path) -> Path:
    """A ledger database one revision behind head, as an older `ledger` left it."""
    assert invoke(home, "source", "add", "s1").exit_code == 0
    db = Database(f"sqlite:///{home / 'ledger.db'}")
    migrate.downgrade(db, "0002")
    db.dispose()
    return home / "ledger.db"


def backups(home: Path) -> list[str]:
    return sorted(p.name for p in home.iterdir() if ".bak-" in p.name)


def test_issue20_item12_no_backup_when_already_at_head(tmp_path: Path) -> None:
    home = tmp_path / "h"
    old_ledger(home)
    first = invoke(home, "db", "upgrade", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["backup"] is not None
    assert len(backups(home)) == 1
    again = invoke(home, "db", "upgrade", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == {
        "from": migrate.head_revision(), "to": migrate.head_revision(), "backup": None
    }
    text = invoke(home, "db", "upgrade")
    assert text.stdout == f"already at revision {migrate.head_revision()}\n"
    assert len(backups(home)) == 1


def test_issue20_item12_backup_names_never_collide(tmp_path: Path) -> None:
    path = old_ledger(tmp_path / "h")
    at = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    names = {migrate.backup_sqlite(path, "0002", at).name for _ in range(3)}
    assert len(names) == 3
    assert all(n.startswith("ledger.db.bak-0002-20261201T093000") for n in names)


def test_issue20_item12_read_only_mount_is_exit_4_one_line(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount for a read-only bind mount")
    home = tmp_path / "h"
    old_ledger(home)
    script = (
        f"mount --bind {home} {home} && mount -o remount,bind,ro {home} && "
        f"exec {sys.executable} -m ledger --home {home} db upgrade"
    )
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind {home} {home}"],
        capture_output=True, check=False,
    )
    if probe.returncode != 0:
        pytest.skip("no permission for a private mount namespace")
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, check=False,
        timeout=120,
    )
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "ledger: the database or its directory is read-only; nothing was written"
    ]
    assert backups(home) == []
