"""The top-level command table: each command's module, attribute and one-line help (one line each).

Invariant: listing the commands (`ledger --help`) imports no command module; a command's module is
imported only when that command is resolved (run, or its own --help). The short help here is the
first sentence of the command's docstring; tests/test_cli_commands.py checks every entry against
the command it loads.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class LazyCommand:
    """Where a top-level command lives ("module:attr") and its short help for the listing."""

    target: str
    short_help: str

    def load(self) -> click.Command:
        """Import the command's module and return the click command."""
        module_name, _, attr = self.target.partition(":")
        command = getattr(importlib.import_module(module_name), attr)
        if not isinstance(command, click.Command):  # pragma: no cover - a wrong table entry
            raise TypeError(f"{self.target} is not a click command")
        return command


# command name -> LazyCommand; add ONE line per command
COMMANDS: dict[str, LazyCommand] = {
    "db": LazyCommand("ledger.cli.db_cmd:db_group", "Schema migrations."),
    "config": LazyCommand("ledger.cli.config_cmd:config_group", "Policy and catalog files."),
    "reserve": LazyCommand(
        "ledger.cli.calls_cmd:reserve",
        "Reserve one provider call, or refuse with a reason code (exit 3).",
    ),
    "settle": LazyCommand(
        "ledger.cli.calls_cmd:settle",
        "Record the outcome of a reservation; prints the kind and every action applied.",
    ),
    "select": LazyCommand(
        "ledger.cli.calls_cmd:select_cmd",
        "Ordered eligible routes and why every other model was excluded (reserves nothing).",
    ),
    "source": LazyCommand(
        "ledger.cli.source_cmd:source_group",
        "Sources: units of background work with their own budgets.",
    ),
    "cooldown": LazyCommand(
        "ledger.cli.cooldown_cmd:cooldown_group", "Provider and model cooldowns."
    ),
    "pool": LazyCommand(
        "ledger.cli.pool_cmd:pool_group",
        "Pools: candidates behind one virtual model, their cursor and sticky leases.",
    ),
    "status": LazyCommand(
        "ledger.cli.status_cmd:status", "Routes, cooldowns, budgets, sources and recent outcomes."
    ),
    "catalog": LazyCommand(
        "ledger.cli.catalog_cmd:catalog", "Providers, models and prices in catalog.json."
    ),
    "worker": LazyCommand(
        "ledger.cli.worker_cmd:worker_group", "Queue workers for cron and services."
    ),
    "serve": LazyCommand(
        "ledger.cli.serve_cmd:serve",
        "Serve the ledger's JSON API on a unix socket in the state directory (and TCP).",
    ),
    "demo": LazyCommand(
        "ledger.cli.demo_cmd:demo",
        "Run the real worker against a local provider stand-in; no setup, no network.",
    ),
    "standin": LazyCommand(
        "ledger.cli.standin_cmd:standin",
        "Run the demo's provider stand-in on 127.0.0.1 until SIGINT or SIGTERM.",
    ),
    "trace": LazyCommand(
        "ledger.cli.trace_cmd:trace_group", "Traces of provider behaviour for `ledger simulate`."
    ),
    "key": LazyCommand(
        "ledger.cli.key_cmd:key_group",
        "Gateway keys: each opens the gateway endpoints only, under its scopes.",
    ),
    "simulate": LazyCommand(
        "ledger.cli.simulate_cmd:simulate",
        "Replay a trace or scenario through the real code in virtual time; compare two policies.",
    ),
}


def register(group: click.Group) -> None:
    """Load and add every command now (the CLI itself loads them lazily; see LedgerGroup)."""
    for name, entry in COMMANDS.items():
        group.add_command(entry.load(), name)
