"""A simulation catalog, policy and scenario file (R-SIM-1), shared by the simulate tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ledger.config import Policy

CATALOG: dict[str, Any] = {
    "providers": {
        "alpha": {"available": True, "api": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1"},
        "beta": {"credentialEnv": "BETA_KEY", "api": "anthropic-messages",
                 "baseUrl": "http://127.0.0.1:9"},
    },
    "models": [
        {"provider": "alpha", "id": "m", "contextWindow": 100_000,
         "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}]},
        {"provider": "beta", "id": "b", "contextWindow": 100_000,
         "pricing": [{"inputUsdPerMTok": 3, "outputUsdPerMTok": 6}]},
    ],
}


def _scenario(tmp_path: Path, **extra: Any) -> Path:
    document = {
        "format": "ledger-scenario",
        "version": 1,
        "start": "2027-01-15T00:00Z",
        "hours": 2.5,
        "latency": {"fixedMs": 1000},
        "tokens": {"input": 1000, "output": 100},
        "inputBytes": 3000,
        "arrivals": [{"at": "00:00", "count": 200}],
        **extra,
    }
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(document))
    return path


def _policy(**keys: Any) -> Policy:
    return Policy.model_validate({"defaultModel": "alpha/m", **keys})
