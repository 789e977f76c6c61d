"""Top-level group, global options and the one place domain errors become exit codes.

Invariant: commands load lazily from the table in `ledger.cli.commands`; a command module is
imported only when that command is resolved, and every error it raises still passes through
`LedgerGroup.invoke`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import Callable
from gettext import gettext as _
from typing import Any, NoReturn

import click

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.cli.commands import COMMANDS
from ledger.clock import iso
from ledger.errors import LedgerError, Refused
from ledger.home import StateDir, state_dir, symlink_warning
from ledger.store.engine import network_filesystem
from ledger.validation import printable

DISTRIBUTION = "llm-budget-ledger"
"""The distribution's name (pyproject's `name`): `ledger` on the public index is another project."""

COMMAND_WORD = re.compile(r"[a-z0-9-]{1,32}")
"""What an unknown command must look like to be echoed back (anything else may be a secret)."""


class AppContext:
    """What every command gets: the resolved state directory and output settings."""

    def __init__(self, home: str | None, db: str | None, debug: bool) -> None:
        self.home = home
        self.db = db
        self.state: StateDir = state_dir(home, db)
        self.debug = debug
        self._ledger: Ledger | None = None

    def ledger(
        self, create: bool = True, catalog: Catalog | None = None, lazy: bool = True
    ) -> Ledger:
        """Open the ledger once per command (policy and catalog read at start, R-HOME-3).

        Nothing is created here: a missing database reads as an empty ledger, and only a write
        that records something creates it; read-only commands pass `create=False` (never), and
        `serve` passes `lazy=False` (a service is the ledger's writer: it creates and migrates
        the database at start, so `/readyz` speaks of a real one). A command that checked the
        catalog first passes it, so the file is read only once.
        """
        if self._ledger is None:
            warning = symlink_warning(self.state.path)
            if warning:
                click.echo(warning, err=True)
            # a command creates the ledger only by a write that records something (issue 25)
            self._ledger = Ledger.open(
                self.home, self.db, create=create, catalog=catalog, lazy=lazy
            )
            path = self._ledger.state.db_path
            fs = network_filesystem(path) if path is not None else None
            if fs:
                click.echo(
                    f"warning: the database is on a network filesystem ({fs}); "
                    "SQLite locking is not reliable there",
                    err=True,
                )
        return self._ledger

    def close(self) -> None:
        """Release the ledger's database connections (a server backend keeps sockets open)."""
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None


pass_app = click.make_pass_decorator(AppContext)


JSON_CHUNK = 16 * 1024


def emit_json(document: Any) -> None:
    """Print one JSON document, in chunks flushed one by one as the text views print their lines,
    so a reader that goes away (`… --json | head -c 10`) is noticed while writing and the command
    stops with status 141 as the text does (one large write could end in a short write and exit
    0; issue 33)."""
    text = json.dumps(document, indent=2, sort_keys=False) + "\n"
    out = sys.stdout  # (CliRunner swaps it; click.get_text_stream is deprecated in click 8.5)
    for start in range(0, len(text), JSON_CHUNK):
        out.write(text[start : start + JSON_CHUNK])
        out.flush()


def fail(error: LedgerError, as_json: bool = False) -> NoReturn:
    """Print one line (or a JSON error object) and exit with the error's code.

    A refusal also says when to retry (`retry_at`), or what clears it when waiting does not.
    """
    if as_json:
        code = getattr(error, "reason", None) or type(error).__name__
        body: dict[str, Any] = {"code": code, "message": error.message}
        if isinstance(error, Refused):
            body["retry_at"] = iso(error.retry_at_ms)
            body["hint"] = None if error.retry_at_ms is not None else _retry(error)
            if error.scope is not None:  # R-SC-1: the scope that refused, and what frees it
                body["scope"] = error.scope
                body["hint"] = _retry(error)
        emit_json({"error": body})
    elif isinstance(error, Refused):
        click.echo(f"ledger: {error.message}; {_retry(error)}", err=True)
    else:
        click.echo(f"ledger: {error.message}", err=True)
    sys.exit(error.exit_code)


def _retry(error: Refused) -> str:
    from ledger.status.refusal_text import retry_text  # lazy: only a refusal pays (start-up)

    return retry_text(error.reason, error.retry_at_ms, error.now_ms)


def run(as_json: bool, action: Callable[[], Any]) -> Any:
    """Run a library call, turning a LedgerError into its one line and exit code."""
    try:
        return action()
    except LedgerError as error:
        fail(error, as_json)


class LedgerGroup(click.Group):
    """A group whose invoke maps errors to exit codes in one place; commands load on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name: the table's and any added directly."""
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, importing its module the first time it is asked for."""
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in COMMANDS:
            command = COMMANDS[cmd_name].load()
            self.add_command(command, cmd_name)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """As click's, but a misspelt name is matched against every command, loaded or not."""
        name = args[0] if args else ""
        missing = args and not name.startswith("-") and self.get_command(ctx, name) is None
        if missing and not ctx.resilient_parsing:
            # a pasted secret is not echoed (R-DIAG-3): only a command-like word is shown
            message = None if COMMAND_WORD.fullmatch(name) else _("No such command.")
            raise click.exceptions.NoSuchCommand(
                name, message, possibilities=self.list_commands(ctx), ctx=ctx
            )
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list as click writes it, from the table's short help (nothing imported)."""
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name)
            if command is None:  # not loaded: a stand-in carrying the table's short help
                command = click.Command(name, help=COMMANDS[name].short_help)
            if not command.hidden:
                rows.append((name, command))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _cmd in rows)
            with formatter.section(_("Commands")):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])

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
            text = printable(error.format_message())
            click.echo(f"ledger: {text}", err=True)
            sys.exit(error.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except BrokenPipeError:  # `ledger … | head`: the reader left; stop quietly
            quiet_broken_pipe()
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
@click.version_option(package_name=DISTRIBUTION)
@click.pass_context
def cli(ctx: click.Context, home: str | None, db: str | None, debug: bool) -> None:
    """ledger: budgets, cooldowns and recovery for background LLM jobs."""
    ctx.obj = AppContext(home, db, debug)
    ctx.call_on_close(ctx.obj.close)


def quiet_broken_pipe() -> NoReturn:
    """Exit as Unix tools do when the reader of stdout went away: no message, status 128+SIGPIPE.

    stdout is pointed at /dev/null first, so the interpreter's final flush cannot fail again.
    """
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(128 + signal.SIGPIPE)


def main() -> None:
    """Console entry point."""
    cli(prog_name="ledger")  # click itself exits quietly (status 1) on EPIPE in help and usage
