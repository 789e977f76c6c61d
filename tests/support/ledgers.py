"""The test ledger's fixed data: its time, its catalog, a manual clock and the policy file writer.

The fixtures that build ledgers from them live in tests/conftest.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledger.api import Ledger

AFFECTED_SQLITE = "3.40.1"  # inside the WAL-reset bug's range (R-DB-3a): the rollback journal

T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a fixed ledger time for tests

TEST_CATALOG: dict[str, Any] = {
    "providers": {
        "alpha": {"available": True, "api": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1"},
        "beta": {"available": True, "api": "anthropic-messages", "baseUrl": "http://127.0.0.1:9"},
        "gamma": {"credentialEnv": "GAMMA_TEST_KEY"},
    },
    "models": [
        {
            "provider": "alpha",
            "id": "small",
            "contextWindow": 100000,
            "maxOutputTokens": 4096,
            "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}],
        },
        {
            "provider": "alpha",
            "id": "big",
            "contextWindow": 200000,
            "maxOutputTokens": 8192,
            "reasoning": True,
            "pricing": [
                {"upToInputTokens": 100000, "inputUsdPerMTok": 3, "outputUsdPerMTok": 15},
                {"inputUsdPerMTok": 6, "outputUsdPerMTok": 22.5},
            ],
        },
        {
            "provider": "beta",
            "id": "mid",
            "contextWindow": 150000,
            "maxOutputTokens": 4096,
            "pricing": [{"inputUsdPerMTok": 0.5, "outputUsdPerMTok": 1.5}],
        },
        {"provider": "beta", "id": "free/unknown", "contextWindow": 8000},
        {
            "provider": "gamma",
            "id": "g1",
            "contextWindow": 32000,
            "pricing": [{"inputUsdPerMTok": 0.1, "outputUsdPerMTok": 0.2}],
        },
    ],
}


class Clock:
    """A manual clock in UTC ms for store tests."""

    def __init__(self, start: int = T0) -> None:
        self.ms = start

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        self.ms += ms


def write_policy(home: Path, **keys: Any) -> None:
    """Write recovery.json with the given camelCase keys."""
    (home / "recovery.json").write_text(json.dumps(keys))


LedgerFactory = Callable[..., Ledger]
