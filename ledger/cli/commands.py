"""Registers every command module on the top-level group (one line per module)."""

from __future__ import annotations

import importlib

import click

# module name -> attribute holding a click command or group
COMMAND_MODULES: tuple[tuple[str, str], ...] = (
    ("db_cmd", "db_group"),
    ("config_cmd", "config_group"),
    ("calls_cmd", "reserve"),
    ("calls_cmd", "settle"),
    ("calls_cmd", "select_cmd"),
    ("source_cmd", "source_group"),
    ("cooldown_cmd", "cooldown_group"),
    ("status_cmd", "status"),
    ("catalog_cmd", "catalog"),
    ("worker_cmd", "worker_group"),
    ("demo_cmd", "demo"),
)


def register(group: click.Group) -> None:
    """Add every command group to the CLI."""
    for module_name, attr in COMMAND_MODULES:
        module = importlib.import_module(f"ledger.cli.{module_name}")
        group.add_command(getattr(module, attr))
