"""`ledger trace export` (R-SIM-2): a ledger's own history as a trace file for `ledger simulate`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ledger.cli.main import AppContext, emit_json, pass_app, run
from ledger.clock import parse_duration_ms
from ledger.simulate.export import export_trace


@click.group("trace")
def trace_group() -> None:
    """Traces of provider behaviour for `ledger simulate`."""


@trace_group.command("export")
@click.option("--since", "since", metavar="DURATION", help="Only the last DURATION (e.g. 24h).")
@click.option("--out", "out", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the trace to FILE instead of stdout.")
@click.option("--json", "as_json", is_flag=True, help="With --out: print a JSON summary.")
@pass_app
def export(app: AppContext, since: str | None, out: Path | None, as_json: bool) -> None:
    """Write this ledger's attempts and source arrivals as a trace (no text, no credentials)."""
    window = None if since is None else run(as_json, lambda: parse_duration_ms(since))
    trace = run(as_json, lambda: export_trace(app.ledger(create=False), window))
    document = trace.to_json()
    if out is None:
        emit_json(document)
        return
    out.write_text(json.dumps(document, indent=2) + "\n")
    summary = {"out": str(out), "attempts": len(trace.attempts), "arrivals": len(trace.arrivals)}
    if as_json:
        emit_json(summary)
    else:
        click.echo(f"wrote {out}: {summary['attempts']} attempts, {summary['arrivals']} arrivals")
