"""`ledger db upgrade` / `current` / `compact` / `journal` (R-DB-4, R-DB-5, R-DB-3c)."""

from __future__ import annotations

from functools import partial

import click

from ledger.cli.main import AppContext, emit_json, pass_app
from ledger.clock import DAY_MS, iso, now_ms, parse_duration_ms
from ledger.config import Policy, load_policy
from ledger.errors import UsageError
from ledger.home import NoLedgerError, check_db_target, ensure_home, sqlite_file
from ledger.store import Database, migrate
from ledger.store.compact import check_older_than, compact
from ledger.store.pending import no_database_yet, open_database


def _database(app: AppContext, create: bool = True, policy: Policy | None = None) -> Database:
    """The database handle; `create=False` (a read) creates neither directory nor file.
    `policy`: the one already read by the command (R-HOME-3: read once). The policy is read
    first: a bad recovery.json is reported before anything is checked or created."""
    if policy is None:
        policy = load_policy(app.state.path)
    check_db_target(app.state.db_url, home=app.state.path.absolute())
    if create:
        ensure_home(app.state.path)
    db = Database(app.state.db_url, busy_timeout_ms=policy.busy_timeout_ms)
    click.get_current_context().call_on_close(db.dispose)
    return db


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
    db = _database(app, create=False)
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


@db_group.command("compact")
@click.option(
    "--older-than",
    "older_than",
    metavar="DURATION",
    default=None,
    help="Fold attempts older than this (default: retentionDays from the policy; at least 24h).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def compact_cmd(app: AppContext, older_than: str | None, as_json: bool) -> None:
    """Fold old settled attempts into per-day totals, in bounded batches (R-DB-6)."""
    policy = load_policy(app.state.path)
    age = parse_duration_ms(older_than) if older_than else policy.retention_days * DAY_MS
    check_older_than(age)
    check_db_target(app.state.db_url, home=app.state.path.absolute())
    db = open_database(
        app.state.db_url,
        create=True,
        lazy=True,
        busy_timeout_ms=policy.busy_timeout_ms,
        prepare=partial(ensure_home, app.state.path),
    )  # nothing recorded yet: folds nothing and creates nothing
    click.get_current_context().call_on_close(db.dispose)
    summary = compact(db, now_ms(), age)
    if as_json:
        emit_json(
            {
                "folded": summary.folded,
                "batches": summary.batches,
                "cutoff": iso(summary.cutoff_ms),
            }
        )
        return
    click.echo(
        f"folded {summary.folded} attempts created before {iso(summary.cutoff_ms)} "
        f"into daily totals ({summary.batches} batches)"
    )


@db_group.command("journal")
@click.argument("mode", required=False, type=click.Choice(["wal", "truncate"]))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def journal(app: AppContext, mode: str | None, as_json: bool) -> None:
    """Show the SQLite library and journal mode; with MODE, turn the file to it (R-DB-3c)."""
    from ledger.store.journal import journal_state, set_journal_mode  # lazy: only this command

    policy = load_policy(app.state.path)
    check_db_target(app.state.db_url, home=app.state.path.absolute())
    path = sqlite_file(app.state.db_url)
    if path is None:
        raise UsageError("the journal mode is a SQLite setting; this ledger is on PostgreSQL")
    if mode is not None and not path.exists():
        raise NoLedgerError(no_database_yet(path))
    state = (
        journal_state(path)
        if mode is None
        else set_journal_mode(app.state.db_url, path, mode, policy.busy_timeout_ms)
    )
    if as_json:
        emit_json(state.to_json())
        return
    safe = "free of the WAL-reset bug" if state.safe else "has the WAL-reset bug"
    click.echo(f"SQLite {state.version} ({state.library}): {safe}")
    journal_now = state.mode or "(no database yet)"
    click.echo(f"journal: {journal_now}; the ledger opens it in {state.chosen}")
