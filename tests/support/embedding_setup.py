"""A real `ledger serve` over a catalog with embedding models, chat models and an Anthropic
provider that allows one beta flag, all on one stand-in (R-FMT-3, R-FMT-4)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ledger.api import Ledger
from ledger.standin.server import StandIn
from tests.support.gateway_setup import STANDIN_KEY, Gateway
from tests.support.serving import running

ALLOWED_BETA = "interleaved-thinking-2025-05-14"
E1_PRICE = 2  # USD per million input tokens: an estimate of 2 micro-USD per input byte


def embedding_catalog(standin: StandIn) -> dict[str, Any]:
    """acme: chat a1, reasoning chat r1 and embedding e1; cirrus: embedding e2; bolt: Anthropic
    chat b1 (betas allowed: ALLOWED_BETA only); delta: Anthropic chat d1 (no betas)."""
    openai_url, anthropic_url = standin.base_url_openai, standin.base_url_anthropic
    return {
        "providers": {
            "acme": {"available": True, "api": "openai-chat", "baseUrl": openai_url},
            "cirrus": {"available": True, "api": "openai-chat", "baseUrl": openai_url},
            "bolt": {"credentialEnv": "BOLT_KEY", "api": "anthropic-messages",
                     "baseUrl": anthropic_url, "betas": [ALLOWED_BETA]},
            "delta": {"credentialEnv": "BOLT_KEY", "api": "anthropic-messages",
                      "baseUrl": anthropic_url},
        },
        "models": [
            {"provider": "acme", "id": "a1", "contextWindow": 100000, "maxOutputTokens": 4096,
             "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}]},
            {"provider": "acme", "id": "r1", "contextWindow": 100000, "maxOutputTokens": 4096,
             "reasoning": True, "pricing": [{"inputUsdPerMTok": 5, "outputUsdPerMTok": 10}]},
            {"provider": "acme", "id": "e1", "kind": "embedding", "contextWindow": 8192,
             "pricing": [{"inputUsdPerMTok": E1_PRICE, "outputUsdPerMTok": 4}]},  # no reply
            {"provider": "cirrus", "id": "e2", "kind": "embedding", "contextWindow": 8192,
             "pricing": [{"inputUsdPerMTok": 3, "outputUsdPerMTok": 0}]},
            {"provider": "bolt", "id": "b1", "contextWindow": 200000, "maxOutputTokens": 8192,
             "reasoning": True, "pricing": [{"inputUsdPerMTok": 3, "outputUsdPerMTok": 6}]},
            {"provider": "delta", "id": "d1", "contextWindow": 200000, "maxOutputTokens": 8192,
             "reasoning": True, "pricing": [{"inputUsdPerMTok": 4, "outputUsdPerMTok": 8}]},
        ],
    }  # fmt: skip


@contextmanager
def embedding_gateway(home: Path, standin: StandIn, **policy: Any) -> Iterator[Gateway]:
    """`ledger serve --listen 127.0.0.1:0` over `embedding_catalog`."""
    (home / "catalog.json").write_text(json.dumps(embedding_catalog(standin)))
    if policy:
        (home / "recovery.json").write_text(json.dumps(policy))
    with running(home, "--listen", "127.0.0.1:0", env={"BOLT_KEY": STANDIN_KEY}) as served:
        gw = Gateway(served, standin)
        try:
            yield gw
        finally:
            gw.close()


def reservation_rows(home: Path) -> list[dict[str, Any]]:
    """Every reservation, oldest first, with the columns the embedding tests read."""
    columns = "model_key, status, input_bytes, estimate_micro, input_tokens, output_tokens, \
actual_micro, cost_micro"
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql(f"SELECT {columns} FROM reservations ORDER BY id").mappings()
        return [dict(r) for r in rows]
