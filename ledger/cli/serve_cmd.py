"""`ledger serve`: the ledger as a local service (README "Service")."""

from __future__ import annotations

import os

import click

from ledger import telemetry
from ledger.cli.main import AppContext, pass_app
from ledger.errors import UsageError

MISSING_EXTRA = (
    "ledger serve needs the serve extra: python -m pip install -e '.[serve]' in the checkout"
)


@click.command("serve")
@click.option(
    "--listen", metavar="HOST:PORT", help="Also listen on TCP (bearer token; loopback only)."
)
@click.option("--allow-remote", is_flag=True, help="Allow a non-loopback --listen address.")
@click.option(
    "--grace",
    type=click.FloatRange(min=0, max=3600),
    default=10.0,
    show_default=True,
    help="Seconds requests in flight get to finish after SIGTERM/SIGINT.",
)
@pass_app
def serve(app: AppContext, listen: str | None, allow_remote: bool, grace: float) -> None:
    """Serve the ledger's JSON API on a unix socket in the state directory (and TCP)."""
    try:
        from ledger.service import server  # lazy: FastAPI is an optional extra (MISSING_EXTRA)
    except ImportError:
        raise UsageError(MISSING_EXTRA) from None
    address = server.parse_listen(listen, allow_remote) if listen is not None else None
    server.check_state_dir(app.state.path)  # before the ledger creates anything (issue 29)
    # bound before anything is created too: a port in use leaves the state directory as it was
    tcp = server.tcp_listener(address) if address is not None else None
    try:
        with telemetry.session(os.environ, lambda line: click.echo(line, err=True)):  # R-OTEL-1
            server.serve(
                app.ledger(lazy=False),
                tcp=tcp,
                grace_s=grace,
                announce=lambda line: click.echo(line, err=True),
            )
    finally:
        if tcp is not None:
            tcp.close()
    server.abandon_stuck_work()
