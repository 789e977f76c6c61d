"""Top-level group, global options and the one place domain errors become exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

from ledger.api import Ledger
from ledger.errors import LedgerError
from ledger.home import StateDir, state_dir, symlink_warning
from ledger.store.engine import network_filesystem


class AppContext:
    """What every command gets: the resolved state directory and output settings."""

    def __init__(self, home: str | None, db: str | None, debug: bool) -> None:
        self.home = home
        self.db = db
        self.state: StateDir = state_dir(home, db)
        self.debug = debug
        self._ledger: Ledger | None = None

    def ledger(self) -> Ledger:
        """Open the ledger once per command (policy and catalog read at start, R-HOME-3)."""
        if self._ledger is None:
            warning = symlink_warning(self.state.path)
            if warning:
                click.echo(warning, err=True)
            self._ledger = Ledger.open(self.home, self.db)
            path = self._ledger.state.db_path
            fs = network_filesystem(path) if path is not None else None
            if fs:
                click.echo(
                    f"warning: the database is on a network filesystem ({fs}); "
                    "SQLite locking is not reliable there",
                    err=True,
                )
        return self._ledger


pass_app = click.make_pass_decorator(AppContext)


def emit_json(document: Any) -> None:
    """Print one JSON document."""
    click.echo(json.dumps(document, indent=2, sort_keys=False))


def fail(error: LedgerError, as_json: bool = False) -> NoReturn:
    """Print one line (or a JSON error object) and exit with the error's code."""
    if as_json:
        code = getattr(error, "reason", None) or type(error).__name__
        emit_json({"error": {"code": code, "message": error.message}})
    else:
        click.echo(f"ledger: {error.message}", err=True)
    sys.exit(error.exit_code)


def run(as_json: bool, action: Callable[[], Any]) -> Any:
    """Run a library call, turning a LedgerError into its one line and exit code."""
    try:
        return action()
    except LedgerError as error:
        fail(error, as_json)


class LedgerGroup(click.Group):
    """A group whose invoke maps errors to exit codes in one place."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LedgerError as error:
            app = ctx.find_object(AppContext)
            if app is not None and app.debug:
                raise
            fail(error)
        except click.UsageError as error:  # bad input: one line, exit 2 (SPEC 13)
            if isinstance(error, click.exceptions.NoArgsIsHelpError):
                raise
            text = "".join(c if c.isprintable() else "?" for c in error.format_message())
            click.echo(f"ledger: {text}", err=True)
            sys.exit(error.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("ledger: interrupted", err=True)
            sys.exit(130)
        except Exception as error:
            app = ctx.find_object(AppContext)
            if app is not None and app.debug:
                raise
            click.echo(
                f"ledger: internal error ({type(error).__name__}); rerun with --debug for details",
                err=True,
            )
            sys.exit(1)


@click.group(cls=LedgerGroup)
@click.option(
    "--home",
    "home",
    metavar="DIR",
    help="State directory (default: $LEDGER_HOME, $XDG_STATE_HOME/ledger, ~/.local/state/ledger).",
)
@click.option("--db", "db", metavar="URL", help="Database path or SQLAlchemy URL ($LEDGER_DB).")
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
@click.version_option(package_name="ledger")
@click.pass_context
def cli(ctx: click.Context, home: str | None, db: str | None, debug: bool) -> None:
    """ledger: budgets, cooldowns and recovery for background LLM jobs."""
    ctx.obj = AppContext(home, db, debug)


def _register() -> None:
    from ledger.cli import commands

    commands.register(cli)


def main() -> None:
    """Console entry point."""
    _register()
    cli(prog_name="ledger")
