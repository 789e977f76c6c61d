"""`ledger demo`: the main job on an embedded default (SPEC section 14); a thin shell over
ledger.demo.run_demo."""

from __future__ import annotations

import sys

import click

from ledger.cli.main import AppContext, emit_json, pass_app, run
from ledger.cli.worker_cmd import progress_printer
from ledger.demo import DEFAULT_SOURCES, MAX_SOURCES, run_demo
from ledger.worker import Stopper


@click.command("demo")
@click.option("--home", "demo_home", metavar="DIR", default=None,
              help="Keep the demo's state here (an empty or new directory); "
              "default: a throw-away temporary directory.")
@click.option("--sources", type=click.IntRange(1, MAX_SOURCES), default=DEFAULT_SOURCES,
              show_default=True, help="How many sources to enqueue.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document.")
@pass_app
def demo(app: AppContext, demo_home: str | None, sources: int, as_json: bool) -> None:
    """Run the real worker against a local provider stand-in; no setup, no network."""
    home = demo_home or app.home
    tty = sys.stderr.isatty() and not as_json
    stopper = Stopper()
    with stopper.installed():
        result = run(
            as_json,
            lambda: run_demo(
                home, sources=sources, stopper=stopper, on_item=progress_printer(tty)
            ),
        )
    if tty:
        sys.stderr.write("\n")
    if as_json:
        emit_json(result.to_json())
        return
    facts = result.to_json()["facts"]
    click.echo(result.summary.progress_line())
    click.echo(
        f"[demo] {result.http_requests} HTTP requests to the local stand-in in "
        f"{result.wall_ms / 1000:.1f} s; {facts['cross_provider_fallbacks']} cross-provider "
        f"fallbacks, {facts['active_cooldowns']} cooldowns active; sources "
        + ", ".join(f"{n} {state}" for state, n in facts["sources"].items())
    )
    if result.home:
        click.echo(f"[demo] state kept in {result.home}")
    click.echo("")
    click.echo("$ ledger status")
    click.echo(result.status_text)
