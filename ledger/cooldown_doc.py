"""The JSON documents of `cooldown set` / `cooldown clear` (CLI `--json` and the service).

Pure: a `CooldownChange` read in the operation's own write transaction in, JSON data out.
"""

from __future__ import annotations

from typing import Any

from ledger.clock import iso
from ledger.store.views import CooldownChange


def change_json(change: CooldownChange) -> dict[str, Any]:
    """The target, the cooldown in force (`until`, null when none) and every one that refuses."""
    top = change.in_force
    return {
        "scope": change.scope.value,
        "target": change.target,
        "until": None if top is None else iso(top.until_ms),
        "remaining_s": None if top is None else round((top.until_ms - change.now_ms) / 1000, 3),
        "kind": None if top is None else top.kind,
        "origin": None if top is None else top.origin.value,
        "cooldowns": [c.to_json(change.now_ms) for c in change.blocking],
    }


def set_json(change: CooldownChange) -> dict[str, Any]:
    """`cooldown set --json`: the change plus the manual row (never shortened, R-POL-2)."""
    manual = change.manual_row()
    until = change.manual_until_ms if manual is None else manual.until_ms
    assert until is not None
    return {
        **change_json(change),
        "manual": {
            "until": iso(until),
            "remaining_s": round((until - change.now_ms) / 1000, 3),
            "reason": None if manual is None else manual.reason,
        },
    }
