"""`ledger status` (R-DIAG-1, R-DIAG-2): the operator's dashboard, as text, JSON or Prometheus."""

from __future__ import annotations

import os
import shutil
import sys

import click

from ledger.cli.main import AppContext, emit_json, fail, pass_app, run
from ledger.errors import UsageError
from ledger.status import build_status, render_prometheus, render_text
from ledger.status_text import WIDTH

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
@pass_app
def status(app: AppContext, as_json: bool, prometheus: bool) -> None:
    """Routes, cooldowns, budgets, sources and recent outcomes."""
    if as_json and prometheus:
        fail(UsageError("choose one of --json and --prometheus"), as_json)
    doc = run(as_json, lambda: build_status(app.ledger(create=False)))
    if as_json:
        emit_json(doc)
    elif prometheus:
        click.echo(render_prometheus(doc), nl=False)
    else:
        click.echo(render_text(doc, dashboard_width()))
