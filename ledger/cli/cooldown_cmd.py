"""`ledger cooldown list|set|clear` (R-POL-8): each says which cooldown is in force on the target
and what else still refuses it, with the command that clears each."""

from __future__ import annotations

import click

from ledger.cli.main import AppContext, emit_json, pass_app, run
from ledger.clock import human_duration_ms, iso, parse_duration_ms
from ledger.documents import change_json, set_json
from ledger.errors import UsageError
from ledger.store.views import CooldownChange, CooldownRow, cooldown_list


@click.group("cooldown")
def cooldown_group() -> None:
    """Provider and model cooldowns."""


@cooldown_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def list_cooldowns(app: AppContext, as_json: bool) -> None:
    """Active cooldowns with time left, kind, origin and reason."""
    now, rows = run(as_json, lambda: cooldown_list(app.ledger(create=False).db))
    if as_json:
        emit_json({"cooldowns": [c.to_json(now) for c in rows]})
        return
    if not rows:
        click.echo("no active cooldowns")
    for c in rows:
        click.echo(
            f"{c.scope.value:8} {c.target[:48]:48} {human_duration_ms(c.until_ms - now):>6} left"
            f"  {c.kind:16} {c.origin.value}" + (f"  reason: {c.reason}" if c.reason else "")
        )


def _row_line(c: CooldownRow, now: int) -> str:
    """One cooldown that refuses the target, with the command that clears it."""
    what = c.kind if c.kind == c.origin.value else f"{c.kind} ({c.origin.value})"
    return (
        f"  {c.scope.value} {c.target}: {what} until {iso(c.until_ms)}"
        f" ({human_duration_ms(c.until_ms - now)}); clear: {c.clear_command()}"
        + (f"; reason: {c.reason}" if c.reason else "")
    )


def _still_refused(change: CooldownChange) -> list[str]:
    """What refuses the target now: the cooldown in force first, or that nothing does."""
    now, name = change.now_ms, f"{change.scope.value} {change.target}"
    top = change.in_force
    if top is None:
        return [f"{name} is no longer cooling"]
    return [
        f"{name} still refused until {iso(top.until_ms)} ({human_duration_ms(top.until_ms - now)})"
        " by:",
        *(_row_line(c, now) for c in change.blocking),
    ]


@cooldown_group.command("set")
@click.argument("target")
@click.argument("duration")
@click.option("--reason", metavar="TEXT", help="A short note for other operators (shown in lists).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def set_cooldown(
    app: AppContext, target: str, duration: str, reason: str | None, as_json: bool
) -> None:
    """Cool a provider (`openai`) or a model (`openai/gpt-x`) for DURATION (`2h`, `1h30m`)."""

    def act() -> tuple[CooldownChange, int]:
        ms = parse_duration_ms(duration)
        if reason is not None and (len(reason) > 200 or not reason.isprintable()):
            raise UsageError("a reason must be at most 200 printable characters")
        led = app.ledger()
        scope, key = led.cooldown_target(target)
        return led.store.set_cooldown(scope, key, ms, reason), ms

    change, asked = run(as_json, act)
    if as_json:
        emit_json(set_json(change))
        return
    manual = change.manual_row()
    until = change.manual_until_ms if manual is None else manual.until_ms
    assert until is not None
    now = change.now_ms
    kept = " (an existing longer manual cooldown is kept)" if until > now + asked else ""
    click.echo(
        f"manual cooldown on {change.scope.value} {change.target} until {iso(until)}"
        f" ({human_duration_ms(until - now)}){kept}"
    )
    if len(change.blocking) > 1 or manual is None:  # something besides it refuses the target
        for line in _still_refused(change):
            click.echo(line)


@cooldown_group.command("clear")
@click.argument("target")
@click.option("--force", is_flag=True, help="Also clear policy and provider-hint cooldowns.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def clear_cooldown(app: AppContext, target: str, force: bool, as_json: bool) -> None:
    """Remove manual cooldowns on TARGET (policy ones need --force); says what still refuses."""

    def act() -> CooldownChange:
        led = app.ledger()
        scope, key = led.cooldown_target(target)
        return led.store.clear_cooldown(scope, key, force)

    change = run(as_json, act)
    if as_json:
        emit_json({**change_json(change), "target": target, "removed": change.removed})
        return
    if change.removed == 0 and change.in_force is None:  # never cooling: nothing to say is over
        click.echo(f"{change.scope.value} {change.target} is not cooling; nothing to clear")
        return
    kinds = "cooldown(s)" if force else "manual cooldown(s)"
    click.echo(f"removed {change.removed} {kinds} on {change.scope.value} {change.target}")
    for line in _still_refused(change):
        click.echo(line)
