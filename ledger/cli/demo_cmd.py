"""`ledger demo`: the main job on an embedded default (SPEC section 14); a thin shell over
ledger.demo.run_demo."""

from __future__ import annotations

import shlex
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import click

from ledger.cli.main import AppContext, emit_json, pass_app, run
from ledger.cli.worker_cmd import Progress
from ledger.demo import DEFAULT_SOURCES, DEMO_KEY, DEMO_KEY_ENV, MAX_SOURCES, DemoResult, run_demo
from ledger.worker.queue import plural
from ledger.worker.stop import Stopper


@click.command("demo")
@click.option("--home", "demo_home", metavar="DIR", default=None,
              help="Put the demo's state here (an empty or new directory); "
              "default: a new temporary directory, kept afterwards.")
@click.option("--discard", is_flag=True,
              help="Remove the demo's temporary directory at the end.")
@click.option("--sources", type=click.IntRange(1, MAX_SOURCES), default=DEFAULT_SOURCES,
              show_default=True, help="How many sources to enqueue.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document.")
@pass_app
def demo(
    app: AppContext, demo_home: str | None, discard: bool, sources: int, as_json: bool
) -> None:
    """Run the real worker against a local provider stand-in; no setup, no network."""
    home = demo_home or app.home
    progress = Progress(sys.stderr.isatty() and not as_json)
    stopper = Stopper()
    with stopper.installed():
        result: DemoResult = run(
            as_json,
            lambda: run_demo(
                home, sources=sources, stopper=stopper, on_item=progress, discard=discard
            ),
        )
    progress.finish()
    if as_json:
        emit_json(result.to_json())
        return
    facts = result.to_json()["facts"]
    click.echo(result.summary.progress_line())
    click.echo(
        f"[demo] {result.http_requests} HTTP requests to the local stand-in in "
        f"{result.wall_ms / 1000:.1f} s; "
        f"{plural(facts['cross_provider_fallbacks'], 'cross-provider fallback')}, "
        f"{plural(facts['active_cooldowns'], 'cooldown')} active; sources "
        + ", ".join(f"{n} {state}" for state, n in facts["sources"].items())
    )
    click.echo("")
    click.echo(f"$ {follow_up(result, 'status')}" if result.kept else "$ ledger status")
    click.echo(result.status_text)
    click.echo("")
    if result.gateway:  # the demo ends with one request through the gateway (SPEC section 19)
        click.echo(f"[demo] gateway: {result.gateway}")
    for line in next_steps(result):
        click.echo(line)


def follow_up(result: DemoResult, command: str) -> str:
    """The exact command line that looks at the demo's ledger."""
    return f"ledger --home {shlex.quote(result.home)} {command}"


def serve_extra_installed() -> bool:
    """Whether `ledger serve` can start here (the serve extra: FastAPI and uvicorn)."""
    return all(find_spec(name) is not None for name in ("fastapi", "uvicorn"))


SERVE_EXTRA_STEP = (
    "  python -m pip install -e '.[serve]'    # once, in the checkout (the Quickstart's install "
    "has no service)"
)


def next_steps(result: DemoResult, serve_installed: bool | None = None) -> list[str]:
    """Where the state is and what to run next (or that it is gone); the suggested `serve`
    works with what is installed: without the serve extra the line installing it comes first
    (issue 33)."""
    if serve_installed is None:
        serve_installed = serve_extra_installed()
    if not result.kept:
        return [f"[demo] state directory {result.home} removed (--discard)"]
    sources: list[dict[str, Any]] = result.status["sources"]["list"]
    paused = [s["id"] for s in sources if s["state"] == "paused"]
    shown = paused[0] if paused else (sources[0]["id"] if sources else None)
    page = str(Path(result.home) / "status.html")
    lines = [
        f"[demo] state kept in {result.home}; look around with:",
        f"  {follow_up(result, 'status')}",
    ]
    if shown is not None:
        lines.append(f"  {follow_up(result, 'source show ' + shlex.quote(shown))}")
    lines += [
        f"  {follow_up(result, 'cooldown list')}",
        f"  rm -r {shlex.quote(result.home)}    # when done",
        "[demo] its status page, as one file or served at / by the service:",
        f"  {follow_up(result, 'status --html ' + shlex.quote(page))}",
        *([] if serve_installed else [SERVE_EXTRA_STEP]),
        f"  {follow_up(result, 'serve')}",
    ]
    if result.standin_port:
        lines += [
            "[demo] its catalog points at the stand-in, which stopped with the demo; to go on "
            "working against it, run it again on the same port (in another terminal):",
            f"  ledger standin --port {result.standin_port}",
            f"  {follow_up(result, 'source add more-1')}",
            f"  {DEMO_KEY_ENV}={DEMO_KEY} {follow_up(result, 'worker run --once')}",
        ]
    return lines
