"""`ledger status` (R-DIAG-1, R-DIAG-2, R-SRV-8): the operator's dashboard, as text, JSON,
Prometheus or a standalone HTML page."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from ledger.cli.main import AppContext, emit_json, fail, pass_app, run
from ledger.errors import LedgerError, UsageError
from ledger.home import write_atomic
from ledger.status.document import (
    build_status,
    render_prometheus,
    render_prometheus_down,
    render_text,
)
from ledger.status.text import WIDTH

MAX_WIDTH = 160


def dashboard_width() -> int:
    """The terminal's width (80 to 160 columns used); 100 when stdout is a pipe or a file."""
    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return min(MAX_WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    return WIDTH


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (stable shape).")
@click.option(
    "--prometheus", is_flag=True, help="Numeric part in Prometheus text exposition format."
)
@click.option(
    "--html",
    "html_file",
    metavar="FILE",
    type=click.Path(dir_okay=False, writable=False, path_type=Path),
    help="Write the status page as one standalone HTML file (replaced whole, never partial).",
)
@pass_app
def status(app: AppContext, as_json: bool, prometheus: bool, html_file: Path | None) -> None:
    """Routes, cooldowns, budgets, sources and recent outcomes."""
    if sum([as_json, prometheus, html_file is not None]) > 1:
        fail(UsageError("choose one of --json, --prometheus and --html"), as_json)
    if prometheus:
        doc = prometheus_status(app)
    else:
        doc = run(as_json, lambda: build_status(app.ledger(create=False), from_shell=True))
    if html_file is not None:
        write_page(app, doc, html_file)
    elif as_json:
        emit_json(doc)
    elif prometheus:
        click.echo(render_prometheus(doc), nl=False)
    else:
        click.echo(render_text(doc, dashboard_width()))


def prometheus_status(app: AppContext) -> dict[str, Any]:
    """The document, or (when the ledger cannot be read) `ledger_up 0` on stdout before the
    one-line error and its exit code: a cron textfile exporter then alerts instead of going on
    with stale numbers or zeros (issue 29 item 12)."""
    try:
        return build_status(app.ledger(create=False), from_shell=True)
    except LedgerError as error:
        click.echo(render_prometheus_down(), nl=False)
        fail(error)


def write_page(app: AppContext, doc: dict[str, Any], target: Path) -> None:
    """The standalone page, written to a temporary file beside `target` and renamed over it."""
    from ledger.page import render_page  # lazy: jinja2 only for --html (status start-up)

    html = render_page(
        doc, inline=True, home=str(app.state.path), db_url_given=app.db is not None
    )
    try:
        write_atomic(target, html.encode(), mode=0o644)
    except OSError as exc:
        fail(UsageError(f"cannot write {target}: {exc.strerror or type(exc).__name__}"))
    click.echo(f"wrote {target}")
