"""`ledger source add|list|show|pause|resume|done|evolve`: queue and per-source views."""

from __future__ import annotations

from typing import Any

import click

from ledger.cli.main import AppContext, emit_json, pass_app, run
from ledger.clock import iso
from ledger.documents import correction_label, source_document, source_json
from ledger.errors import NotFoundError
from ledger.status.text import WIDTH, Column, cut, short_time, table, took
from ledger.store.views import source_detail, source_rows


@click.group("source")
def source_group() -> None:
    """Sources: units of background work with their own budgets."""


@source_group.command("add")
@click.argument("source_id")
@click.option("--payload", "payload_ref", metavar="REF", help="Opaque payload reference.")
@click.option("--no-queue", is_flag=True, help="Create without queueing it for workers.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="NAME",
    help="Put the source under this scope of recovery.json (repeatable; R-SC-1).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def add(
    app: AppContext,
    source_id: str,
    payload_ref: str | None,
    no_queue: bool,
    scopes: tuple[str, ...],
    as_json: bool,
) -> None:
    """Create a source and queue it for workers."""
    created = run(
        as_json,
        lambda: app.ledger().add_source(source_id, payload_ref, not no_queue, scopes=scopes),
    )
    if as_json:
        emit_json({"source": source_id, "created": created, "queued": not no_queue})
    else:
        click.echo(
            ("added" if created else "updated")
            + f" source ({'queued' if not no_queue else 'not queued'})"
        )


@source_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def list_sources(app: AppContext, as_json: bool) -> None:
    """List sources with state and counters."""
    rows = run(as_json, lambda: source_rows(app.ledger(create=False).db))
    docs = [source_json(r) for r in rows]
    if as_json:
        emit_json({"sources": docs})
        return
    if not docs:
        click.echo("no sources")
    for d in docs:
        click.echo(
            f"{d['id'][:40]:40}  {d['state']:7} calls {d['calls']:>3}  failures {d['failures']:>2}"
            + (f"  paused: {d['pause_reason']}" if d["pause_reason"] else "")
        )


@source_group.command("show")
@click.argument("source_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def show(app: AppContext, source_id: str, as_json: bool) -> None:
    """The source's counters and whole failover history (R-DIAG-5)."""

    def load() -> dict[str, Any]:
        detail = source_detail(app.ledger(create=False).db, source_id)
        if detail is None:
            raise NotFoundError("unknown source")
        return detail

    doc = source_document(run(as_json, load))
    if as_json:
        emit_json(doc)
        return
    for line in _show_lines(doc):
        click.echo(line)


def _show_lines(doc: dict[str, Any]) -> list[str]:
    """The text of `source show`: a header, counters, then a table of attempts (<= 100 cols)."""
    state = doc["state"] + (f" (paused: {doc['pause_reason']})" if doc["pause_reason"] else "")
    correction = correction_label(doc)
    lines = [
        f"source {doc['id']}",
        f"  state {state}",
        f"  calls {doc['calls']}  failures {doc['failures']}  output failures "
        f"{doc['output_failures']}  time used {took(doc['time_used_ms'])}",
        *_allowance(doc),
        "  models " + (", ".join(doc["models"]) or "none"),
        f"  backoff steps {doc['backoff_steps']}  retry at {doc['retry_at'] or '-'}"
        + (f"  correction {correction}" if correction else ""),
    ]
    if doc["finished"]:
        lines.append(f"  finished {doc['finished']}")
    if doc["lease_owner"]:
        lines.append(f"  leased until {doc['lease_expires']}")
    lines = [cut(line, WIDTH) for line in lines]
    if not doc["attempts"]:
        return [*lines, "  no attempts"]
    rows = [_attempt_row(a) for a in doc["attempts"]]
    return lines + table(  # never cuts a time or a kind (issue 15 item 3)
        (
            Column("id"),  # "#15": a short header keeps the widest row (a named fallback) in 100
            Column("time"),
            Column("model", cut=True, min_width=16),
            Column("outcome"),
            Column("took", right=True),
            Column("role"),
        ),
        rows,
        WIDTH,
    )


def _allowance(doc: dict[str, Any]) -> list[str]:
    """How much of the time used is the whole allowance of unsettled reservations (R-RES-8)."""
    count = doc["open_reservations"]
    if not count:
        return []
    plural = "s" if count > 1 else ""
    return [
        f"  of that, {took(doc['open_allowance_ms'])} is the whole allowance of {count}"
        f" unsettled reservation{plural} (open or expired)"
    ]


def _attempt_row(a: dict[str, Any]) -> tuple[str, ...]:
    """One attempt of `source show`: the immediate follow-up of a failure names it (R-DIAG-5).

    What each failure permitted is in `--json` (`permits`); the text keeps to 100 columns.
    """
    role = next((t for t in ("fallback", "correction", "override") if a[t]), "")
    if a.get("role") == "retry":  # the gateway's one same-model retry (R-GW-4)
        role = "retry"
    if a["after"] is not None:
        role = f"{role} after #{a['after']}"
    role = " ".join(filter(None, (role, "LATE" if a["late"] else "")))
    outcome = f"{a['kind']}/{a['subkind'] or '-'}" if a["kind"] else a["status"]
    when = short_time(a["created"])
    return (f"#{a['id']}", when, a["model"], outcome, took(a["duration_ms"]), role)


def _state_command(action: str, help_text: str) -> click.Command:
    @click.command(action, help=help_text)
    @click.argument("source_id")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @pass_app
    def command(app: AppContext, source_id: str, as_json: bool) -> None:
        change = run(as_json, lambda: app.ledger().set_source_state(source_id, action))
        if as_json:
            emit_json(change.to_json())
        elif change.already:
            click.echo(f"source is already {change.state} ({change.pause_reason}); left as it is")
        else:
            click.echo(f"source is now {change.state}")

    return command


source_group.add_command(_state_command("pause", "Pause a source (manual)."))
source_group.add_command(_state_command("resume", "Resume a paused source (keeps its counters)."))
source_group.add_command(_state_command("done", "Finish a source: it is never rerun."))


@source_group.command("evolve")
@click.argument("source_id")
@click.option("--model", required=True, metavar="KEY")
@click.option("--input-bytes", type=click.IntRange(min=0, max=10**12), default=0)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def evolve(app: AppContext, source_id: str, model: str, input_bytes: int, as_json: bool) -> None:
    """One explicit override attempt on a known source (R-RES-9): skips backoff, cooldowns and
    source caps."""
    res = run(as_json, lambda: app.ledger().evolve(source_id, model, input_bytes=input_bytes))
    if as_json:
        emit_json(res.to_json())
    else:
        click.echo(f"override reservation {res.id}: {res.model} until {iso(res.deadline_ms)}")
