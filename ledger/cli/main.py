"""Top-level group, global options and the one place domain errors become exit codes."""

from __future__ import annotations

import click


@click.group()
def cli() -> None:
    """ledger: budgets, cooldowns and recovery for background LLM jobs."""


def main() -> None:
    """Console entry point."""
    cli()
