"""`ledger standin [--port N]`: the demo's provider stand-in on its own (SPEC 13), so workers, the
service and the gateway can be tried against something that answers, e.g. the catalog the demo
kept (it points at the port the demo's stand-in had)."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from ledger.demo import DEMO_KEY, DEMO_KEY_ENV, OK_REPLY, demo_script
from ledger.errors import UsageError
from ledger.standin.server import StandIn


@click.command("standin")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port on 127.0.0.1 (0: any free port; the line printed says which).")
def standin(port: int) -> None:
    """Run the demo's provider stand-in on 127.0.0.1 until SIGINT or SIGTERM."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = StandIn(demo_script(), default=OK_REPLY, port=port)
        try:
            server.start()
        except OSError:
            raise UsageError(f"cannot listen on 127.0.0.1:{port} (in use?)") from None
        with server:
            click.echo(
                f"stand-in listening on http://127.0.0.1:{server.port} (OpenAI-compatible at "
                f"{server.base_url_openai}, Anthropic at {server.base_url_anthropic}; "
                f"{DEMO_KEY_ENV}={DEMO_KEY}); SIGINT or SIGTERM stops it",
                err=True,
            )
            stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
