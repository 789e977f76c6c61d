"""R-HOME-1..2: where the state directory and database are, and their permissions."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.home import resolve_db_url, resolve_home


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        ("/x/flag", {"LEDGER_HOME": "/x/env", "XDG_STATE_HOME": "/x/xdg"}, "/x/flag"),
        (None, {"LEDGER_HOME": "/x/env", "XDG_STATE_HOME": "/x/xdg"}, "/x/env"),
        (None, {"XDG_STATE_HOME": "/x/xdg"}, "/x/xdg/ledger"),
        (None, {"LEDGER_HOME": "", "XDG_STATE_HOME": "/x/xdg"}, "/x/xdg/ledger"),
    ],
)
def test_r_home_1_resolution_order(flag: str | None, env: dict[str, str], expected: str) -> None:
    assert resolve_home(flag, env) == Path(expected)


def test_r_home_1_default_is_local_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/someone")
    assert resolve_home(None, {}) == Path("/home/someone/.local/state/ledger")


def test_r_home_2_db_override(tmp_path: Path) -> None:
    home = tmp_path
    assert resolve_db_url(home, None, {}) == f"sqlite:///{home / 'ledger.db'}"
    assert resolve_db_url(home, "other.db", {}).endswith("/other.db")
    assert resolve_db_url(home, None, {"LEDGER_DB": "sqlite:////a/b.db"}) == "sqlite:////a/b.db"
    assert resolve_db_url(home, "postgresql://h/db", {"LEDGER_DB": "x"}) == "postgresql://h/db"


def test_r_home_1_directory_0700_and_database_0600(tmp_path: Path) -> None:
    home = tmp_path / "deep" / "state"
    result = CliRunner().invoke(cli, ["--home", str(home), "db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "ledger.db").stat().st_mode) == 0o600


def test_r_home_1_env_var_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_HOME", str(tmp_path / "envhome"))
    result = CliRunner().invoke(cli, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "envhome" / "ledger.db").exists()


def test_r_home_2_db_option_puts_database_elsewhere(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.db"
    result = CliRunner().invoke(
        cli, ["--home", str(tmp_path / "h"), "--db", str(other), "source", "add", "s"]
    )
    assert result.exit_code == 0, result.output
    assert other.exists()
    assert not (tmp_path / "h" / "ledger.db").exists()
