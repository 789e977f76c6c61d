"""`ledger cooldown list|set|clear` (R-POL-8)."""

from __future__ import annotations

import click

from ledger.cli.main import AppContext, emit_json, pass_app, run
from ledger.clock import iso
from ledger.durations import format_duration_ms, parse_duration_ms
from ledger.errors import UsageError
from ledger.store.views import cooldown_list


@click.group("cooldown")
def cooldown_group() -> None:
    """Provider and model cooldowns."""


@cooldown_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def list_cooldowns(app: AppContext, as_json: bool) -> None:
    """Active cooldowns with time left, kind and origin."""
    now, rows = run(as_json, lambda: cooldown_list(app.ledger(create=False).db))
    docs = [c.to_json(now) for c in rows]
    if as_json:
        emit_json({"cooldowns": docs})
        return
    if not docs:
        click.echo("no active cooldowns")
    for c, d in zip(rows, docs, strict=True):
        click.echo(
            f"{d['scope']:8} {d['target'][:48]:48} {format_duration_ms(c.until_ms - now):>9} left"
            f"  {d['kind']:16} {d['origin']}"
        )


@cooldown_group.command("set")
@click.argument("target")
@click.argument("duration")
@click.option("--reason", metavar="TEXT", help="A short note for other operators.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def set_cooldown(
    app: AppContext, target: str, duration: str, reason: str | None, as_json: bool
) -> None:
    """Cool a provider (`openai`) or a model (`openai/gpt-x`) for DURATION (`2h`, `1h30m`)."""

    def act() -> tuple[str, str, int, int]:
        ms = parse_duration_ms(duration)
        if reason is not None and (len(reason) > 200 or not reason.isprintable()):
            raise UsageError("a reason must be at most 200 printable characters")
        led = app.ledger()
        scope, key = led.cooldown_target(target)
        now, until = led.store.set_cooldown(scope, key, ms, reason)
        return scope.value, key, now, until

    scope, key, now, until = run(as_json, act)
    if as_json:
        emit_json(
            {
                "scope": scope,
                "target": key,
                "until": iso(until),
                "remaining_s": round((until - now) / 1000, 3),
                "origin": "manual",
            }
        )
    else:
        click.echo(f"{scope} cooldown until {iso(until)} ({format_duration_ms(until - now)})")


@cooldown_group.command("clear")
@click.argument("target")
@click.option("--force", is_flag=True, help="Also clear policy and provider-hint cooldowns.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def clear_cooldown(app: AppContext, target: str, force: bool, as_json: bool) -> None:
    """Remove manual cooldowns on TARGET (policy ones need --force)."""

    def act() -> int:
        led = app.ledger()
        scope, key = led.cooldown_target(target)
        return led.store.clear_cooldown(scope, key, force)

    removed = run(as_json, act)
    if as_json:
        emit_json({"target": target, "removed": removed})
    else:
        click.echo(f"removed {removed} cooldown(s)")
