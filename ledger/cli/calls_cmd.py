"""`ledger reserve`, `ledger settle`, `ledger select`: one library call each, rendered."""

from __future__ import annotations

import json
from functools import partial

import click

from ledger.api import Ledger
from ledger.catalog import NO_CATALOG, Catalog
from ledger.classify import classify_http, classify_kind
from ledger.cli.main import AppContext, emit_json, fail, pass_app, run
from ledger.clock import iso, now_ms
from ledger.errors import Refused, UsageError
from ledger.kinds import ExclusionReason, FailureKind
from ledger.records import (
    MAX_TOKENS,
    Cancelled,
    Failed,
    Outcome,
    Success,
    check_cost_usd,
    micro_to_usd,
)
from ledger.routing.select import Selection, exclusion_json
from ledger.status.text import credential_hint, missing_pieces

NONNEG = click.IntRange(min=0, max=MAX_TOKENS)


def _finite_usd(_ctx: click.Context, _param: click.Parameter, value: float | None) -> float | None:
    try:
        check_cost_usd(value)
    except UsageError:
        raise click.BadParameter("must be a finite non-negative amount") from None
    return value


@click.command("reserve")
@click.argument("source")
@click.option("--model", "model", required=True, metavar="KEY", help="provider/model-id")
@click.option("--input-bytes", type=NONNEG, default=0, show_default=True)
@click.option("--request-id", metavar="ID", help="Idempotency key (R-RES-10a).")
@click.option("--override", is_flag=True, help="One explicit attempt past source caps (R-RES-9).")
@click.option(
    "--after",
    type=click.IntRange(min=1, max=2**62),
    metavar="ID",
    help="The failed reservation whose permitted fallback or correction this is (R-POL-4).",
)
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="NAME",
    help="Put the reservation under this scope of recovery.json too (repeatable; R-SC-1).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def reserve(
    app: AppContext,
    source: str,
    model: str,
    input_bytes: int,
    request_id: str | None,
    override: bool,
    after: int | None,
    scopes: tuple[str, ...],
    as_json: bool,
) -> None:
    """Reserve one provider call, or refuse with a reason code (exit 3)."""
    if after is not None and override:
        fail(UsageError("--after and --override do not go together"), as_json)
    res = run(
        as_json,
        lambda: app.ledger().reserve(
            source,
            model,
            input_bytes=input_bytes,
            request_id=request_id,
            override=override,
            after=after,
            scopes=scopes,
        ),
    )
    if as_json:
        emit_json(res.to_json())
        return
    est = micro_to_usd(res.estimate_micro)
    click.echo(
        f"reservation {res.id}: {res.model} for source {res.source} until "
        f"{iso(res.deadline_ms)} ({(res.deadline_ms - res.created_ms) / 1000:g} s allowed), "
        f"estimate {'unknown' if est is None else f'${est:.6f}'}"
        + (f" ({res.role.value})" if res.role.value != "primary" else "")
        + (" (replayed)" if res.replayed else "")
    )


def _outcome(
    ok: bool,
    http_status: int | None,
    kind: str | None,
    cancelled: bool,
    code: str | None,
    retry_after: str | None,
    reason: str | None,
    usage: tuple[int | None, int | None, float | None, int | None, int | None],
    finish: bool,
    side_effects: bool,
) -> Outcome:
    chosen = sum([ok, http_status is not None, kind is not None, cancelled])
    if chosen != 1:
        raise UsageError("give exactly one of --ok, --http-status, --kind, --cancelled")
    if not ok and (finish or any(u is not None for u in usage)):
        raise UsageError("--finish and usage options go with --ok")
    if http_status is None and (code is not None or retry_after is not None):
        raise UsageError("--code and --retry-after go with --http-status")
    if ok:
        return Success(usage[0], usage[1], usage[2], finish, usage[3], usage[4])
    if cancelled:
        return Cancelled()
    if http_status is not None:
        headers = {"retry-after": retry_after} if retry_after is not None else {}
        body = json.dumps({"error": {"code": code}}).encode() if code else None
        return Failed(classify_http(http_status, headers, body, now_ms()), side_effects)
    assert kind is not None
    return Failed(classify_kind(kind, reason), side_effects)


@click.command("settle")
@click.argument("reservation", type=click.IntRange(min=1, max=2**62))
@click.option("--ok", is_flag=True, help="The call succeeded.")
@click.option(
    "--input-tokens", type=NONNEG, help="Prompt tokens billed at the input price (uncached)."
)
@click.option("--output-tokens", type=NONNEG)
@click.option("--cache-write-tokens", type=NONNEG, help="Prompt tokens written to the cache.")
@click.option("--cache-read-tokens", type=NONNEG, help="Prompt tokens read from the cache.")
@click.option("--cost-usd", type=float, callback=_finite_usd)
@click.option("--finish", is_flag=True, help="The source is finished (never rerun).")
@click.option("--http-status", type=click.IntRange(min=100, max=599))
@click.option("--code", metavar="C", help="The provider's error code, if any.")
@click.option("--retry-after", metavar="S", help="The Retry-After header value.")
@click.option("--kind", type=click.Choice([k.value for k in FailureKind]))
@click.option("--reason", metavar="R", help="The broken rule (invalid_output, write_rejected).")
@click.option("--cancelled", is_flag=True)
@click.option("--side-effects", is_flag=True, help="The attempt already caused side effects.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def settle(
    app: AppContext,
    reservation: int,
    ok: bool,
    input_tokens: int | None,
    output_tokens: int | None,
    cache_write_tokens: int | None,
    cache_read_tokens: int | None,
    cost_usd: float | None,
    finish: bool,
    http_status: int | None,
    code: str | None,
    retry_after: str | None,
    kind: str | None,
    reason: str | None,
    cancelled: bool,
    side_effects: bool,
    as_json: bool,
) -> None:
    """Record the outcome of a reservation; prints the kind and every action applied."""

    def act() -> object:
        outcome = _outcome(
            ok,
            http_status,
            kind,
            cancelled,
            code,
            retry_after,
            reason,
            (input_tokens, output_tokens, cost_usd, cache_write_tokens, cache_read_tokens),
            finish,
            side_effects,
        )
        return app.ledger().settle(reservation, outcome)

    result = run(as_json, act)
    if as_json:
        emit_json(result.to_json())
        return
    click.echo(
        f"reservation {result.reservation_id}: {result.status.value}"
        + (f" ({result.kind}/{result.subkind})" if result.kind else "")
        + (" LATE - do not commit the result" if result.late else "")
    )
    for action in result.actions:  # the actions already say whether a fallback is permitted
        click.echo(f"  - {action}")


@click.command("select")
@click.argument("source")
@click.option("--model", metavar="KEY", help="The default model for this call.")
@click.option("--after-failure", type=click.Choice([k.value for k in FailureKind]))
@click.option("--failed-model", metavar="KEY")
@click.option("--tried", multiple=True, metavar="KEY", help="Models already tried (repeatable).")
@click.option("--input-bytes", type=NONNEG, default=0, show_default=True)
@click.option("--all", "show_all", is_flag=True, help="List every excluded model, not a summary.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def select_cmd(
    app: AppContext,
    source: str,
    model: str | None,
    after_failure: str | None,
    failed_model: str | None,
    tried: tuple[str, ...],
    input_bytes: int,
    show_all: bool,
    as_json: bool,
) -> None:
    """Ordered eligible routes and why every other model was excluded (reserves nothing)."""
    if (after_failure is None) != (failed_model is None):
        fail(UsageError("--after-failure and --failed-model go together"), as_json)
    led: Ledger = run(as_json, lambda: app.ledger(create=False))
    tried_set = frozenset(tried) | (frozenset([failed_model]) if failed_model else frozenset())
    for key in sorted(tried_set):
        run(as_json, partial(led.model, key))
    selection = run(
        as_json,
        lambda: led.select(
            source,
            model=model,
            input_bytes=input_bytes,
            after_failure=FailureKind(after_failure) if after_failure else None,
            failed_model=failed_model,
            tried=tried_set,
        ),
    )
    if as_json:
        emit_json(selection.to_json(led.catalog))
    else:
        _echo_chain(selection)
        if selection.routes:
            click.echo("routes (in order):")
            for i, route in enumerate(selection.routes, 1):
                effort = getattr(route, "effort", None)
                click.echo(f"  {i}. {route}" + (f"  (effort {effort})" if effort else ""))
            _echo_pools(selection)
        else:
            click.echo("no eligible route")
            if not led.catalog.models:
                click.echo(f"hint: {NO_CATALOG}")
        named = frozenset(filter(None, (model, failed_model)))
        _echo_excluded(selection, led.catalog, named, show_all)
        if selection.retry_at_ms is not None:
            click.echo(f"earliest route frees at {iso(selection.retry_at_ms)}")
    if not selection.routes:
        raise SystemExit(Refused.exit_code)


def _echo_chain(selection: Selection) -> None:
    """Which chain the primary got and why (R-RT-1)."""
    chain = selection.chain
    if chain is None:
        return
    if chain.field == "chains":
        click.echo(f"chain: chains[{chain.key}] ({chain.why})")
    elif chain.field is not None:
        click.echo(f"chain: {chain.field} ({chain.why})")
    else:
        click.echo(f"chain: none ({chain.why})")


def _echo_pools(selection: Selection) -> None:
    """Each pool route's candidates with their state (R-RT-5): the reserve picks among the
    eligible ones in its own write transaction."""
    for pool in selection.pools:
        click.echo(f"pool {pool.name} ({pool.strategy}, sticky {pool.sticky}):")
        for cand in pool.candidates:
            tier = f"  tier {cand.tier}" if cand.tier else ""
            until = f" until {iso(cand.until_ms)}" if cand.until_ms is not None else ""
            click.echo(f"  {cand.key}{tier}  {cand.state}{until}")


def _echo_excluded(
    selection: Selection, catalog: Catalog, named: frozenset[str], show_all: bool
) -> None:
    """Every exclusion with --all; else a count per reason plus the models the caller named.

    An unavailable model names the credential variable to set (its name, never its value).
    """
    if not selection.excluded:
        return
    docs = [exclusion_json(e, catalog) for e in selection.excluded]
    shown = [d for d in docs if show_all or d["model"] in named]
    if not show_all:
        click.echo(f"excluded: {len(selection.excluded)} models (--all lists each)")
        counts = selection.excluded_by_reason()
        width = max(len(r) for r in counts)
        variables = credential_hint(str(d.get("credential_env") or "") for d in docs)
        no_url = sum(1 for d in docs if d.get("base_url_missing"))
        if no_url:
            more = f"{no_url} also need a baseUrl in catalog.json"
            variables += ("; " if variables else "") + more
        for reason, count in counts.items():
            note = f"  {variables}" if reason == ExclusionReason.UNAVAILABLE and variables else ""
            click.echo(f"  {reason.ljust(width)}  {count}{note}")
    if shown:
        click.echo("excluded:" if show_all else "named models excluded:")
        width = max(len(str(d["model"])) for d in shown)
        for d in shown:
            need = missing_pieces(d)
            click.echo(f"  {str(d['model']).ljust(width)}  {d['reason']}{need}")
