"""Render benchmark rows as a Markdown table with the machine line (results.md).

Invariant: the document names everything needed to judge the numbers: machine, Python and SQLite
versions, the journal mode chosen, the date and whether the run was the quick mode.
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import UTC, datetime

from bench.common import Row
from ledger.store import sqlite_driver
from ledger.store.engine import chosen_journal_mode


def machine_lines(quick: bool) -> list[str]:
    """Machine, versions, journal mode, date."""
    mode = "QUICK (smoke run; numbers not meaningful)" if quick else "full"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [
        f"- machine: {os.cpu_count()} CPUs, {platform.platform()}",
        f"- Python {platform.python_version()} ({sys.implementation.name}), "
        f"SQLite {sqlite_driver.library_version()} ({sqlite_driver.LIBRARY}), "
        f"journal mode `{chosen_journal_mode()}`, synchronous=FULL",
        f"- date: {stamp}; mode: {mode}; load average at start: {_load()}",
    ]


def _load() -> str:
    try:
        return ", ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover - platforms without it
        return "n/a"


def _met(row: Row) -> str:
    if row.met is None:
        return ""
    return "yes" if row.met else "**no**"


def table(rows: list[Row]) -> list[str]:
    """Markdown table lines."""
    lines = [
        "| figure | median | spread | target | met | note |",
        "| --- | ---: | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r.figure} | {r.value} | {r.spread} | {r.target} | {_met(r)} | {r.note} |")
    return lines


def document(rows: list[Row], quick: bool, notes: list[str]) -> str:
    """The whole results.md."""
    parts = [
        "# ledger benchmark results",
        "",
        *machine_lines(quick),
        "",
        *table(rows),
        "",
        "Ratios are formed from runs taken side by side in the same process (alternating chunks),",
        "so disk and CPU noise hit both sides alike; absolute times depend on the machine.",
        "Reproduce: `python -m bench` (full) or `python -m bench --quick` (seconds, CI smoke).",
    ]
    if notes:
        parts += ["", "Notes:", *[f"- {n}" for n in notes]]
    return "\n".join(parts) + "\n"
