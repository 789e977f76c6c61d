"""The lazy command table (SPEC 13): `ledger --help` lists every command from the table without
importing command modules; a command loads when it runs, and its errors still map to exit codes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ledger.api import Ledger
from ledger.cli import commands
from ledger.cli.commands import COMMANDS, LazyCommand
from ledger.cli.main import cli

# Modules a status run must not import (network, migrations tooling, other commands' code).
HEAVY = (
    "httpx", "alembic", "ledger.worker.item", "ledger.providers", "ledger.litellm", "ledger.demo"
)


def _probe(*args: str) -> tuple[int, list[str], str]:
    """Run the CLI in a new interpreter: exit code, ledger/httpx/alembic modules loaded, stdout."""
    script = (
        "import json, sys\n"
        "from ledger.cli.main import cli\n"
        "try:\n"
        f"    cli.main({list(args)!r}, prog_name='ledger')\n"
        "except SystemExit as stop:\n"
        "    code = stop.code or 0\n"
        "names = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ledger', 'httpx', 'alembic'))\n"
        "print(json.dumps([code, names]), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    code, names = json.loads(result.stderr.strip().splitlines()[-1])
    return int(code), names, result.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_table_entry_is_the_command_it_loads(name: str) -> None:
    loaded = COMMANDS[name].load()
    assert loaded.name == name
    stand_in = click.Command(name, help=COMMANDS[name].short_help)
    for limit in (20, 45, 60, 200):  # the listing shows the same text at every terminal width
        assert stand_in.get_short_help_str(limit) == loaded.get_short_help_str(limit)


def test_help_lists_every_command_without_importing_any_command_module() -> None:
    code, modules, output = _probe("--help")
    assert code == 0
    listed = output.split("Commands:", 1)[1].split()
    assert set(COMMANDS) <= set(listed)
    assert not [m for m in modules if m.endswith("_cmd")], modules


def test_help_equals_the_eagerly_registered_listing() -> None:
    eager = click.Group("ledger", help=cli.help, params=cli.params)
    commands.register(eager)
    assert eager.list_commands(click.Context(eager)) == sorted(COMMANDS)
    lazy = CliRunner().invoke(cli, ["--help"], prog_name="ledger", terminal_width=80)
    full = CliRunner().invoke(eager, ["--help"], prog_name="ledger", terminal_width=80)
    assert lazy.output == full.output


def test_status_json_imports_only_its_own_command(home: Path) -> None:
    Ledger.open(home).close()  # an existing, up-to-date database (creating one runs alembic)
    code, modules, output = _probe("--home", str(home), "status", "--json")
    assert code == 0
    assert json.loads(output)["schema"] == 1
    assert [m for m in modules if m.endswith("_cmd")] == ["ledger.cli.status_cmd"]
    assert not [m for m in modules if m.startswith(HEAVY)], modules


def test_errors_of_a_lazily_loaded_command_keep_their_exit_code(home: Path) -> None:
    code, modules, _ = _probe("--home", str(home), "cooldown", "set", "no-such-provider", "1h")
    assert code == 2  # UsageError, mapped by LedgerGroup.invoke
    assert "ledger.cli.cooldown_cmd" in modules


def test_a_command_that_fails_to_load_is_an_internal_error(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = {**COMMANDS, "broken": LazyCommand("ledger.cli.no_such_module:cmd", "Broken.")}
    monkeypatch.setattr(sys.modules["ledger.cli.main"], "COMMANDS", broken)
    result = CliRunner().invoke(cli, ["--home", str(home), "broken"])
    assert result.exit_code == 1
    assert "internal error (ModuleNotFoundError)" in result.output


def test_add_command_still_works_beside_the_lazy_table() -> None:
    extra = click.Command("extra-test-command", callback=lambda: click.echo("extra ran"))
    cli.add_command(extra)
    try:
        result = CliRunner().invoke(cli, ["extra-test-command"])
        assert result.output == "extra ran\n"
        assert "extra-test-command" in cli.list_commands(click.Context(cli))
    finally:
        cli.commands.pop("extra-test-command")


def test_python_dash_m_ledger_runs_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ledger", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert "status" in result.stdout
