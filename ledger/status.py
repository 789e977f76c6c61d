"""The status document (R-DIAG-1): built from one read of the ledger; rendered as text or JSON."""

from __future__ import annotations

import sqlite3
from typing import Any

from ledger.api import Ledger
from ledger.store import migrate
from ledger.store.views import meta_values


def build_status(ledger: Ledger) -> dict[str, Any]:
    """The whole status document."""
    meta = meta_values(ledger.db)
    return {
        "default_model": ledger.policy.default_model,
        "policy_fingerprint": ledger.fingerprint,
        "store": {
            "sqlite_version": sqlite3.sqlite_version,
            "journal_mode": migrate.pragma(ledger.db, "journal_mode"),
            "journal_mode_chosen": meta.get("journal_mode"),
            "revision": migrate.current_revision(ledger.db),
        },
    }


def render_text(doc: dict[str, Any]) -> str:
    """A compact dashboard for a terminal."""
    store = doc["store"]
    return "\n".join(
        [
            f"default model   {doc['default_model'] or '(none set)'}",
            f"policy          {doc['policy_fingerprint']}",
            f"store           SQLite {store['sqlite_version']}, journal {store['journal_mode']}, "
            f"revision {store['revision']}",
        ]
    )


def render_prometheus(doc: dict[str, Any]) -> str:
    """The numeric part in Prometheus text format."""
    return "# HELP ledger_up Ledger status was read.\n# TYPE ledger_up gauge\nledger_up 1\n"
