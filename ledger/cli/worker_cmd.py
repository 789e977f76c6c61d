"""`ledger worker run`: drain due sources with a handler (R-Q-3, R-Q-4); a thin shell over
ledger.worker.drain.drain."""

from __future__ import annotations

import os
import sys

import click

from ledger import telemetry
from ledger.catalog import NO_CATALOG, load_catalog
from ledger.cli.main import AppContext, emit_json, fail, pass_app, run
from ledger.client import LedgerClient
from ledger.config import load_policy
from ledger.errors import StoreError, UsageError
from ledger.inert import config_findings
from ledger.worker.drain import MAX_SLEEP_MS, drain
from ledger.worker.handler import load_handler
from ledger.worker.port import WorkerLedger
from ledger.worker.queue import DrainSummary, ItemReport
from ledger.worker.stop import Stopper


@click.group("worker")
def worker_group() -> None:
    """Queue workers for cron and services."""


class Progress:
    """Redraws one progress line on stderr while draining (terminals only) and erases it at the
    end, so the final summary is printed once, on stdout."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._shown = 0

    def __call__(self, _item: ItemReport, summary: DrainSummary) -> None:
        if self.enabled:
            line = summary.progress_line()
            sys.stderr.write("\r" + line.ljust(self._shown))
            sys.stderr.flush()
            self._shown = max(self._shown, len(line))

    def finish(self) -> None:
        """Erase the progress line."""
        if self.enabled and self._shown:
            sys.stderr.write("\r" + " " * self._shown + "\r")
            sys.stderr.flush()
            self._shown = 0


def _unreachable_line(error: StoreError) -> None:
    """With --loop: one line when the database or the service goes out of reach."""
    click.echo(f"warning: {error}; waiting with backoff and going on when it answers", err=True)


@worker_group.command("run")
@click.option("--handler", "handler_spec", metavar="MODULE:FUNCTION",
              default="ledger.worker:echo_handler", show_default=True,
              help="The function called for each attempt.")
@click.option("--once", "mode", flag_value="once", default=True,
              help="Drain until nothing workable is due, then exit (default; for cron).")
@click.option("--loop", "mode", flag_value="loop",
              help="Keep polling, sleeping until the soonest retry time, until SIGTERM.")
@click.option("--max-items", type=click.IntRange(min=1), default=None,
              help="Stop after this many queue items.")
@click.option("--worker-id", metavar="ID", default=None,
              help="Lease owner name (default host:pid:random).")
@click.option("--max-sleep", type=click.FloatRange(0.2, 3600), default=MAX_SLEEP_MS / 1000,
              show_default=True, help="With --loop: the longest pause between polls, seconds.")
@click.option("--server", metavar="SOCKET_OR_URL", default=None,
              help="Work through a running `ledger serve` (its socket, state directory or URL; "
              "TCP takes the token from $LEDGER_TOKEN).")
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
@pass_app
def run_cmd(
    app: AppContext,
    handler_spec: str,
    mode: str,
    max_items: int | None,
    worker_id: str | None,
    max_sleep: float,
    server: str | None,
    as_json: bool,
) -> None:
    """Drain due sources: claim, at most two immediate attempts, release (R-POL-4).

    Exit codes: 0 worked or nothing due; 3 every item claimed was refused (budget, cooldown,
    source limits) before any call; 2 bad usage or configuration (e.g. a catalog with no models);
    4 database busy or unusable, or (without --loop) the database server or the service out of
    reach; with --loop an outage is one line on stderr, waited out with backoff. A source that
    used its own sourceCalls or sourceTimeMs is paused with that reason (it is not claimed again
    until resumed).
    """
    if worker_id is not None and not (1 <= len(worker_id) <= 200 and worker_id.isprintable()):
        raise click.BadParameter("must be 1 to 200 printable characters", param_hint="--worker-id")
    handler = run(as_json, lambda: load_handler(handler_spec))
    ledger: WorkerLedger
    if server is None:
        catalog = run(as_json, lambda: load_catalog(app.state.path))
        if not catalog.models:  # bad configuration, not a refusal (R-Q-3): nothing is written
            fail(UsageError(NO_CATALOG), as_json)
        ledger = app.ledger(catalog=catalog)
    else:  # many workers share the service's one warm writer (R-SRV-7)
        policy = run(as_json, lambda: load_policy(app.state.path))
        # the served ledger's catalog (issue 33): the models the service reserves, not a
        # catalog.json of this worker's own state directory
        with LedgerClient(server, home=app.state.path, policy=policy) as first:
            served = run(as_json, first.served_catalog)
        if not served.models:
            fail(UsageError(NO_CATALOG), as_json)
        ledger = LedgerClient(server, home=app.state.path, policy=policy, catalog=served)
    for warning in config_findings(ledger.policy, ledger.catalog, ledger.env).warnings():
        click.echo(f"warning: {warning}", err=True)  # issue 15 item 8: inert entries at start
    stopper = Stopper()
    progress = Progress(sys.stderr.isatty() and not as_json)
    warn = lambda line: click.echo(line, err=True)  # noqa: E731
    with stopper.installed(), telemetry.session(os.environ, warn):  # R-OTEL-1
        summary = run(
            as_json,
            lambda: drain(
                ledger,
                handler,
                worker_id=worker_id,
                loop=mode == "loop",
                max_items=max_items,
                stopper=stopper,
                on_item=progress,
                max_sleep_ms=int(max_sleep * 1000),
                on_unreachable=_unreachable_line,
            ),
        )
    progress.finish()
    if isinstance(ledger, LedgerClient):
        ledger.close()
    if as_json:
        emit_json(summary.to_json())
    else:
        click.echo(summary.progress_line())
    sys.exit(summary.exit_code())
