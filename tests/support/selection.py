"""The selector tests' catalog, times and snapshot builders (SPEC section 9), shared by the pure
selector tests and its per-catalog cache tests."""

from __future__ import annotations

from typing import Any

from ledger.catalog import Catalog
from ledger.kinds import CooldownOrigin, CooldownScope
from ledger.routing.select import (
    CooldownView,
    Snapshot,
)

NOW = 1_700_000_000_000


MIN = 60_000


def price(inp: float | None, out: float | None) -> list[dict[str, Any]]:
    return [{"inputUsdPerMTok": inp, "outputUsdPerMTok": out}]


def catalog_of(models: list[dict[str, Any]]) -> Catalog:
    """A catalog whose providers are those the models name (availability decided by Snapshot).

    Every provider has a base URL except `nourl`, which has none and no known one (issue 13).
    """
    providers = {
        m["provider"]: {"available": True}
        | ({} if m["provider"] == "nourl" else {"baseUrl": "http://127.0.0.1:9/v1"})
        for m in models
    }
    return Catalog.model_validate({"providers": providers, "models": models})


MODELS: list[dict[str, Any]] = [
    {"provider": "openai", "id": "gpt-a", "contextWindow": 128_000, "maxOutputTokens": 16_000,
     "pricing": price(0.4, 1.6)},
    {"provider": "openai", "id": "gpt-b", "contextWindow": 128_000, "maxOutputTokens": 16_000,
     "pricing": price(0.1, 0.4)},
    {"provider": "anthropic", "id": "claude-s", "contextWindow": 200_000,
     "maxOutputTokens": 64_000, "reasoning": True, "pricing": price(3, 15)},
    {"provider": "anthropic", "id": "claude-h", "contextWindow": 200_000,
     "maxOutputTokens": 8_000, "pricing": price(1, 5)},
    {"provider": "local", "id": "llama", "contextWindow": 8192, "maxOutputTokens": 2048},
    {"provider": "local", "id": "free", "contextWindow": 8192, "pricing": price(0, 0)},
    {"provider": "vision", "id": "img", "input": ["image"], "output": ["text"]},
    {"provider": "offline", "id": "x", "pricing": price(0.01, 0.01)},
]  # fmt: skip


CATALOG = catalog_of(MODELS)


AVAILABLE = frozenset({"openai", "anthropic", "local", "vision"})


def snap(**kw: Any) -> Snapshot:
    base: dict[str, Any] = {"now_ms": NOW, "available_providers": AVAILABLE, "cooldowns": ()}
    return Snapshot(**{**base, **kw})


def cooldown(scope: CooldownScope, target: str, until_ms: int) -> CooldownView:
    return CooldownView(scope, target, until_ms, "rate_limit", CooldownOrigin.POLICY)
