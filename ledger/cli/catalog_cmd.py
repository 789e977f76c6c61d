"""`ledger catalog`: init, show and import-litellm (R-CAT-1, R-CAT-2, R-CAT-4).

Invariant: commands only parse, call and render. Nothing is written on an error or with
--dry-run; file content and credential values are never printed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from ledger.catalog import (
    Catalog,
    Model,
    catalog_exists,
    example_catalog,
    load_catalog,
    write_catalog,
)
from ledger.cli.main import AppContext, emit_json, pass_app, run
from ledger.errors import UsageError
from ledger.home import ensure_home
from ledger.litellm import (
    CHAT_ONLY,
    WITH_EMBEDDINGS,
    ImportResult,
    convert,
    merge,
    parse_litellm,
)
from ledger.validation import shown_url

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@dataclass(frozen=True)
class ImportReport:
    """What an import did: the conversion counts and the merged catalog."""

    result: ImportResult
    merged: Catalog
    written: bool


@click.group("catalog")
def catalog() -> None:
    """Providers, models and prices in catalog.json."""


@catalog.command("import-litellm")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--providers", metavar="A,B", help="Import only these litellm_provider values.")
@click.option("--dry-run", is_flag=True, help="Report what would be imported; write nothing.")
@click.option(
    "--embeddings", is_flag=True, help='Import `mode: "embedding"` models too (R-FMT-3).'
)
@json_option
@pass_app
def import_litellm(
    app: AppContext,
    file: Path,
    providers: str | None,
    dry_run: bool,
    embeddings: bool,
    as_json: bool,
) -> None:
    """Import chat models and prices from LiteLLM's model_prices_and_context_window.json."""
    kinds = WITH_EMBEDDINGS if embeddings else CHAT_ONLY
    report: ImportReport = run(
        as_json, lambda: _import(app.state.path, file, _provider_set(providers), dry_run, kinds)
    )
    result = report.result
    if as_json:
        emit_json(
            {
                "imported": result.imported,
                "skipped": result.skipped,
                "skippedByReason": dict(result.skipped_by_reason),
                "aliases": result.aliases,
                "conflictingDuplicates": list(result.conflicting_duplicates),
                "totalModels": len(report.merged.models),
                "totalProviders": len(report.merged.providers),
                "written": report.written,
            }
        )
        return
    reasons = ", ".join(f"{k} {v}" for k, v in result.skipped_by_reason.items())
    what = "chat and embedding" if embeddings else "chat"
    click.echo(f"imported {result.imported} {what} models ({result.aliases} aliases followed)")
    click.echo(f"skipped {result.skipped}" + (f" ({reasons})" if reasons else ""))
    for key in result.conflicting_duplicates:
        click.echo(f"warning: {key}: entries with different data; kept the priced/most complete")
    click.echo(
        f"catalog: {len(report.merged.models)} models, {len(report.merged.providers)} providers"
        + ("" if report.written else " (dry run: nothing written)")
    )


@catalog.command("init")
@click.option("--force", is_flag=True, help="Replace an existing catalog.json.")
@json_option
@pass_app
def init(app: AppContext, force: bool, as_json: bool) -> None:
    """Write the example catalog to catalog.json in the state directory."""
    example: Catalog = run(as_json, lambda: _init(app.state.path, force))
    if as_json:
        emit_json(
            {"written": True, "providers": len(example.providers), "models": len(example.models)}
        )
    else:
        click.echo(
            f"wrote catalog.json: {len(example.providers)} providers, {len(example.models)} models"
        )


@catalog.command("show")
@json_option
@pass_app
def show(app: AppContext, as_json: bool) -> None:
    """List providers (availability, never credentials) and models with sizes and prices."""
    home = app.state.path
    current: Catalog = run(as_json, lambda: load_catalog(home))
    available = current.available_providers(os.environ)
    providers = [
        {
            "name": name,
            "api": p.api,
            "baseUrl": _shown(current.base_url(name)),
            "available": name in available,
        }
        for name, p in current.providers.items()
    ]
    models = [_model_row(m) for m in current.models]
    if as_json:
        emit_json({"providers": providers, "models": models})
        return
    if not catalog_exists(home):
        click.echo("no catalog.json (run `ledger catalog init` or `ledger catalog import-litellm`)")
        return
    click.echo("providers:")
    for name, provider in current.providers.items():
        url = _shown(current.base_url(name)) or "none (not offered: no_base_url)"
        click.echo(
            f"  {name}  api={provider.api}  baseUrl={url}  available={_yes(name in available)}"
        )
    click.echo("models:")
    for model in current.models:
        click.echo(
            f"  {model.key}  window={_num(model.context_window)}"
            f"  max_output={_num(model.max_output_tokens)}  price={_prices(model)}"
            f"  reasoning={_yes(model.reasoning) if model.reasoning is not None else '?'}"
            + _cache_prices(model)
        )


def _provider_set(option: str | None) -> frozenset[str] | None:
    if option is None:
        return None
    names = frozenset(n.strip() for n in option.split(",") if n.strip())
    if not names:
        raise UsageError("--providers must name at least one provider")
    return names


def _import(
    home: Path,
    file: Path,
    providers: frozenset[str] | None,
    dry_run: bool,
    kinds: frozenset[str] = CHAT_ONLY,
) -> ImportReport:
    try:
        text = file.read_bytes()
    except OSError as exc:
        raise UsageError("the LiteLLM file cannot be read") from exc
    result = convert(parse_litellm(text), providers, kinds)
    merged = merge(load_catalog(home), result.catalog)
    if not dry_run:
        write_catalog(ensure_home(home), merged)
    return ImportReport(result=result, merged=merged, written=not dry_run)


def _init(home: Path, force: bool) -> Catalog:
    if catalog_exists(home) and not force:
        raise UsageError("catalog.json already exists; use --force to replace it")
    example = example_catalog()
    write_catalog(ensure_home(home), example)
    return example


def _model_row(model: Model) -> dict[str, Any]:
    return {
        "key": model.key,
        "contextWindow": model.context_window,
        "maxOutputTokens": model.max_output_tokens,
        "pricing": [t.model_dump(by_alias=True, exclude_none=True) for t in model.pricing or []]
        if model.pricing is not None
        else None,
        "reasoning": model.reasoning,
    }


def _prices(model: Model) -> str:
    """`in/out` USD per MTok per tier, e.g. `3/15 <=200000; 6/22.5`; `unknown` when unset."""
    if not model.pricing:
        return "unknown"
    parts = []
    for tier in model.pricing:
        text = f"{_num(tier.input_usd_per_mtok)}/{_num(tier.output_usd_per_mtok)}"
        if tier.up_to_input_tokens is not None:
            text += f" <={tier.up_to_input_tokens}"
        parts.append(text)
    return "; ".join(parts)


def _cache_prices(model: Model) -> str:
    """`  cache=write/read` USD per MTok per tier when any is set (`?`: the input price applies)."""
    tiers = model.pricing or []
    if all(t.cache_write_usd_per_mtok is None and t.cache_read_usd_per_mtok is None for t in tiers):
        return ""
    parts = [
        f"{_num(t.cache_write_usd_per_mtok)}/{_num(t.cache_read_usd_per_mtok)}"
        + (f" <={t.up_to_input_tokens}" if t.up_to_input_tokens is not None else "")
        for t in tiers
    ]
    return "  cache=" + "; ".join(parts)


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    return format(Decimal(repr(value)).normalize(), "f")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _shown(url: str | None) -> str | None:
    return None if url is None else shown_url(url)
