"""`ledger db upgrade` / `ledger db current` (R-DB-4, R-DB-5)."""

from __future__ import annotations

import click

from ledger.cli.main import AppContext, emit_json, pass_app
from ledger.config import load_policy
from ledger.home import ensure_home
from ledger.store import Database, migrate


def _database(app: AppContext) -> Database:
    ensure_home(app.state.path)
    policy = load_policy(app.state.path)
    return Database(app.state.db_url, busy_timeout_ms=policy.busy_timeout_ms)


@click.group("db")
def db_group() -> None:
    """Schema migrations."""


@db_group.command("upgrade")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def upgrade(app: AppContext, as_json: bool) -> None:
    """Back up the database (online backup API), then migrate it to the newest revision."""
    before, after, backup = migrate.upgrade(_database(app))
    if as_json:
        emit_json({"from": before, "to": after, "backup": str(backup) if backup else None})
        return
    if backup is not None:
        click.echo(f"backup: {backup}")
    if before == after:
        click.echo(f"already at revision {after}")
    else:
        click.echo(f"upgraded {before or '(new database)'} -> {after}")


@db_group.command("current")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def current(app: AppContext, as_json: bool) -> None:
    """Show the database's schema revision and the newest this ledger knows."""
    db = _database(app)
    path = migrate.db_file(db)
    revision = None
    if path is None or path.exists():
        if path is not None:
            migrate._check_sqlite_header(path)
        revision = migrate.current_revision(db)
    head = migrate.head_revision()
    if as_json:
        emit_json({"revision": revision, "head": head, "up_to_date": revision == head})
        return
    click.echo(f"{revision or '(empty)'}{' (head)' if revision == head else f' (head is {head})'}")
