"""`ledger config validate` / `ledger config schema` (R-CFG-3..5)."""

from __future__ import annotations

import json

import click

from ledger.catalog import load_catalog
from ledger.cli.main import AppContext, emit_json, pass_app
from ledger.config import POLICY_FILE, Policy, load_policy, policy_schema
from ledger.errors import LedgerError
from ledger.inert import check_routing, config_findings, effort_warnings
from ledger.store.scopes import scopes_in_use


@click.group("config")
def config_group() -> None:
    """Policy and catalog files."""


@config_group.command("validate")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def validate(app: AppContext, as_json: bool) -> None:
    """Check recovery.json and catalog.json; list inert entries as warnings."""
    policy = load_policy(app.state.path)
    catalog = load_catalog(app.state.path)
    check_routing(policy, catalog, str(app.state.path / POLICY_FILE))  # R-RT-3: exit 2
    findings = config_findings(policy, catalog)
    warnings = (
        findings.warnings()
        + [w.message for w in effort_warnings(policy, catalog)]
        + unused_scope_warnings(app, policy)
    )
    # Issue 13: a provider with no baseUrl (and none known) is never called, so never offered.
    no_base_url = sorted(catalog.providers_without_base_url())
    if as_json:
        emit_json(
            {
                "valid": True,
                "policy_fingerprint": policy.fingerprint(),
                "models": len(catalog.models),
                "providers": len(catalog.providers),
                "warnings": warnings,
                "inert": [entry.to_json() for entry in findings.inert],
                "providers_without_base_url": no_base_url,
            }
        )
        return
    click.echo(
        f"valid: policy {policy.fingerprint()}, catalog {len(catalog.providers)} providers, "
        f"{len(catalog.models)} models"
    )
    for warning in warnings:
        click.echo(f"warning: {warning}")
    if no_base_url:
        click.echo(
            f"warning: {len(no_base_url)} providers have no baseUrl and none is known; "
            f"their models are not offered (no_base_url): {', '.join(no_base_url)}"
        )


def unused_scope_warnings(app: AppContext, policy: Policy) -> list[str]:
    """A scope that no source, live key or reservation of the last 24 h uses limits nothing:
    likely a typo or a leftover (R-SC-1). Read from the ledger when it exists."""
    if not policy.scopes:
        return []
    try:
        used = scopes_in_use(app.ledger(create=False).db)
    except LedgerError as error:
        return [f"scopes were not checked against the ledger: {error.message}"]
    return [
        f"scope {name}: no source, key or reservation in the last 24 h uses it (it limits "
        "nothing until one does)"
        for name in sorted(set(policy.scopes) - used)
    ]


@config_group.command("schema")
def schema() -> None:
    """Print the JSON Schema of recovery.json."""
    click.echo(json.dumps(policy_schema(), indent=2))
