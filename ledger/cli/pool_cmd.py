"""`ledger pool list|show NAME|cycle NAME [DURATION]` (R-RT-7): each a library call, rendered."""

from __future__ import annotations

import click

from ledger.cli.main import AppContext, emit_json, pass_app, run
from ledger.clock import iso, parse_duration_ms
from ledger.routing.pools import PoolView
from ledger.status.pools import cycle_pool, pool_view_named, pool_views

DEFAULT_CYCLE = "30m"


@click.group("pool")
def pool_group() -> None:
    """Pools: candidates behind one virtual model, their cursor and sticky leases."""


def _lines(view: PoolView) -> list[str]:
    cursor = "-" if view.cursor is None else str(view.cursor)
    lines = [
        f"pool {view.name}: {view.strategy}, sticky {view.sticky} ({view.sticky_scope}), "
        f"cursor {cursor}"
    ]
    for i, cand in enumerate(view.candidates):
        mark = "*" if view.cursor == i else " "
        extra = f" tier {cand.tier}" if cand.tier else ""
        extra += f" effort {cand.effort}" if cand.effort else ""
        until = f" until {iso(cand.until_ms)}" if cand.until_ms is not None else ""
        lines.append(f" {mark} {cand.key}{extra}  {cand.state}{until}")
    for lease in view.leases:
        scope = "pool" if not lease.scope else f"source {lease.scope}"
        until = "until it fails or cools"
        if lease.until_ms is not None:
            until = f"until {iso(lease.until_ms)}"
        lines.append(f"   sticky: {scope} -> {lease.model} ({until})")
    return lines


@pool_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def list_pools(app: AppContext, as_json: bool) -> None:
    """Every pool with its strategy, cursor, candidates' state and live sticky leases."""
    views = run(as_json, lambda: pool_views(app.ledger(create=False)))
    if as_json:
        emit_json({"pools": [v.to_json() for v in views]})
        return
    if not views:
        click.echo("no pools in the policy")
    for view in views:
        click.echo("\n".join(_lines(view)))


@pool_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def show_pool(app: AppContext, name: str, as_json: bool) -> None:
    """One pool: strategy, cursor, each candidate's state and reason, live sticky leases."""
    view = run(as_json, lambda: pool_view_named(app.ledger(create=False), name))
    if as_json:
        emit_json(view.to_json())
        return
    click.echo("\n".join(_lines(view)))


@pool_group.command("cycle")
@click.argument("name")
@click.argument("duration", required=False, default=DEFAULT_CYCLE)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def cycle(app: AppContext, name: str, duration: str, as_json: bool) -> None:
    """Cool the pool's current pick by hand for DURATION (default 30m) and move on."""
    ms = run(as_json, lambda: parse_duration_ms(duration))
    pick, change = run(as_json, lambda: cycle_pool(app.ledger(), name, ms))
    until = change.manual_until_ms
    if as_json:
        emit_json({"pool": name.removeprefix("pool/"), "cooled": pick, "until": iso(until)})
        return
    click.echo(f"pool {name.removeprefix('pool/')}: cooled {pick} until {iso(until)}; moving on")
