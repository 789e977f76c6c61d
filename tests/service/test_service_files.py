"""The service's files in the state directory (R-SRV-1, issue 29 items 5 and 7): whatever is at
`ledger.token` or `ledger.sock.lock` (not ASCII, a directory, a dangling symlink, a FIFO, loose
permissions) is one line naming the file and exit 2, never a traceback or a hang; a state
directory writable by others is refused; a home too long for a socket creates nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ledgers import TEST_CATALOG
from tests.support.serving import running, serve_argv

TOKEN = "ledger.token"
LOCK = "ledger.sock.lock"


def _serve(home: Path) -> subprocess.CompletedProcess[str]:
    """`ledger serve --listen` that must end by itself (a hang is a test failure, not a wait)."""
    return subprocess.run(
        serve_argv(home, "--listen", "127.0.0.1:0"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "LEDGER_TOKEN"},
    )


def _one_line_naming(result: subprocess.CompletedProcess[str], path: Path) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0]
    assert "Traceback" not in result.stderr
    assert "internal error" not in result.stderr
    return lines[0]


def _non_ascii(path: Path) -> None:
    path.write_bytes("tøken-with-a-non-ascii-byte-0123456789\n".encode())
    path.chmod(0o600)


def _directory(path: Path) -> None:
    path.mkdir()


def _dangling_symlink(path: Path) -> None:
    path.symlink_to(path.with_name("nowhere"))


def _fifo(path: Path) -> None:
    os.mkfifo(path, 0o600)


def _group_readable(path: Path) -> None:
    path.write_text("a-perfectly-good-token-0123456789\n")
    path.chmod(0o640)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (_non_ascii, "not ASCII"),
        (_directory, "directory"),
        (_dangling_symlink, "symlink"),
        (_fifo, "not a regular file"),
        (_group_readable, "readable by group or others"),
    ],
    ids=["non-ascii", "directory", "dangling-symlink", "fifo", "group-readable"],
)
def test_r_srv_1_a_bad_token_file_is_one_line_and_exit_2(
    home: Path, make: Callable[[Path], None], says: str
) -> None:
    """Before: UnicodeDecodeError / IsADirectoryError exit 1, a FIFO hung for ever, a 0640
    token file was used as it was."""
    make(home / TOKEN)
    line = _one_line_naming(_serve(home), home / TOKEN)
    assert says in line
    assert "0123456789" not in line  # the token is never shown
    assert not (home / "ledger.sock").exists()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (_directory, "directory"),
        (_dangling_symlink, "symlink"),
        (lambda p: p.symlink_to(p.with_name("catalog.json")), "symlink"),
        (_fifo, "not a regular file"),
    ],
    ids=["directory", "dangling-symlink", "symlink-to-a-file", "fifo"],
)
def test_r_srv_5_a_bad_lock_file_is_one_line_and_exit_2(
    home: Path, make: Callable[[Path], None], says: str
) -> None:
    """Before: `internal error (OSError)` exit 1 for a symlink or a directory."""
    make(home / LOCK)
    before = (home / "catalog.json").read_bytes()
    assert says in _one_line_naming(_serve(home), home / LOCK)
    assert (home / "catalog.json").read_bytes() == before  # a link's target is never touched


def test_r_srv_1_a_state_directory_writable_by_others_is_refused(home: Path) -> None:
    """Anyone could replace ledger.sock there: refused (not tightened), before anything opens."""
    home.chmod(0o777)
    try:
        line = _one_line_naming(_serve(home), home)
        assert "writable by group or others" in line
        assert sorted(p.name for p in home.iterdir()) == ["catalog.json"]
    finally:
        home.chmod(0o700)


def test_r_srv_1_a_good_token_file_is_still_used(home: Path) -> None:
    (home / TOKEN).write_text("a-perfectly-good-token-0123456789\n")
    (home / TOKEN).chmod(0o600)
    with running(home, "--listen", "127.0.0.1:0") as served:
        assert served.token == "a-perfectly-good-token-0123456789"


def test_r_srv_1_a_home_too_long_for_a_socket_creates_nothing(tmp_path: Path) -> None:
    """Before: exit 2, but the directory, ledger.db, its journal and both lock files were made."""
    parent = tmp_path / ("d" * 60)
    parent.mkdir()
    home = parent / ("h" * 60)
    result = subprocess.run(
        serve_argv(home), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "too long for a unix socket" in result.stderr
    assert not home.exists()
    assert list(parent.iterdir()) == []


def test_r_srv_1_an_existing_home_too_long_for_a_socket_gets_no_files(tmp_path: Path) -> None:
    home = tmp_path / ("d" * 60) / ("h" * 60)
    home.mkdir(parents=True, mode=0o700)
    (home / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    result = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "serve"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert sorted(p.name for p in home.iterdir()) == ["catalog.json"]
