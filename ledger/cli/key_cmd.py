"""`ledger key create|list|revoke`: gateway keys (R-SC-3); a key is printed once, never stored."""

from __future__ import annotations

import click

from ledger.budgets.scopes import check_names
from ledger.cli.main import AppContext, emit_json, pass_app, run
from ledger.clock import iso, parse_duration_ms
from ledger.keys import check_key_name, state_of
from ledger.status.text import WIDTH, Column, short_time, table
from ledger.store.keys import KeyRow, create_key, list_keys, revoke_key

NOT_SHOWN_AGAIN = (
    "this key is shown only now and will not be shown again (the ledger keeps only a salted "
    "hash of it); store it where the job that uses it can read it"
)


@click.group("key")
def key_group() -> None:
    """Gateway keys: each opens the gateway endpoints only, under its scopes."""


@key_group.command("create")
@click.argument("name")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    required=True,
    metavar="NAME",
    help="A scope of recovery.json the key's requests are put under (repeatable).",
)
@click.option("--expires", metavar="DURATION", help="The key expires this long from now (30d).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the key included, once).")
@pass_app
def create(
    app: AppContext, name: str, scopes: tuple[str, ...], expires: str | None, as_json: bool
) -> None:
    """Create a key and print it once."""

    def make() -> tuple[str, KeyRow]:
        checked = check_key_name(name)
        ledger = app.ledger()
        names = check_names(scopes, ledger.policy)
        expires_in = None if expires is None else parse_duration_ms(expires)
        return create_key(ledger.db, checked, names, expires_in)

    key, row = run(as_json, make)
    if as_json:
        emit_json({**_row_json(row, row.created_ms), "key": key, "notice": NOT_SHOWN_AGAIN})
        return
    click.echo(
        f"key {row.name} created: scopes {', '.join(row.scopes)}; "
        + (f"expires {iso(row.expires_ms)}" if row.expires_ms is not None else "no expiry"),
        err=True,
    )
    click.echo(key)
    click.echo(NOT_SHOWN_AGAIN, err=True)


@key_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def list_cmd(app: AppContext, as_json: bool) -> None:
    """Every key: name, scopes, state, created, expires, last used (never the key; times UTC)."""
    now, found = run(as_json, lambda: list_keys(app.ledger(create=False).db))
    if as_json:
        emit_json({"keys": [_row_json(r, now) for r in found]})
        return
    if not found:
        click.echo("no keys")
        return
    rows = [
        (
            r.name,
            ",".join(r.scopes),
            state_of(now, r.revoked_ms, r.expires_ms),
            short_time(iso(r.created_ms)),
            "never" if r.expires_ms is None else short_time(iso(r.expires_ms)),
            "never" if r.last_used_ms is None else short_time(iso(r.last_used_ms)),
        )
        for r in found
    ]
    columns = (
        Column("name", cut=True, min_width=8),
        Column("scopes", cut=True, min_width=8),
        Column("state"),
        Column("created"),
        Column("expires"),
        Column("last used"),
    )
    for line in table(columns, rows, WIDTH):
        click.echo(line)


@key_group.command("revoke")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def revoke(app: AppContext, name: str, as_json: bool) -> None:
    """End a key at once: every service refuses it from its next request."""
    when = run(as_json, lambda: revoke_key(app.ledger().db, check_key_name(name)))
    if as_json:
        emit_json({"name": name, "revoked": iso(when)})
    else:
        click.echo(f"key {name} revoked at {iso(when)}")


def _row_json(row: KeyRow, now: int) -> dict[str, object]:
    return {
        "name": row.name,
        "scopes": list(row.scopes),
        "state": state_of(now, row.revoked_ms, row.expires_ms),
        "created": iso(row.created_ms),
        "expires": iso(row.expires_ms),
        "revoked": iso(row.revoked_ms),
        "last_used": iso(row.last_used_ms),
    }
