"""A catalog of four accounts of one model (pool candidates) plus two other providers, and a
ledger factory over it, for the routing tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from tests.support.ledgers import Clock

ACCOUNTS = ("acct1", "acct2", "acct3", "acct4")
MEMBERS = [f"{a}/m" for a in ACCOUNTS]


def routing_catalog(base_url: str = "http://127.0.0.1:9") -> dict[str, Any]:
    """Four OpenAI-compatible accounts of model `m`, an Anthropic one and a non-reasoning one."""
    providers: dict[str, Any] = {
        a: {"available": True, "api": "openai-chat", "baseUrl": f"{base_url}/{a}/v1"}
        for a in ACCOUNTS
    }
    providers["claude"] = {"available": True, "api": "anthropic-messages",
                           "baseUrl": f"{base_url}/claude"}  # fmt: skip
    providers["plain"] = {"available": True, "api": "openai-chat", "baseUrl": f"{base_url}/p/v1"}
    price = [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}]
    models: list[dict[str, Any]] = [
        {"provider": a, "id": "m", "contextWindow": 100_000, "maxOutputTokens": 8192,
         "reasoning": True, "pricing": price}
        for a in ACCOUNTS
    ]  # fmt: skip
    models.append({"provider": "claude", "id": "sonnet", "contextWindow": 200_000,
                   "maxOutputTokens": 64_000, "reasoning": True, "pricing": price,
                   "promptCacheTtlS": 60})  # fmt: skip
    models.append({"provider": "plain", "id": "p", "contextWindow": 100_000,
                   "maxOutputTokens": 8192, "reasoning": False, "pricing": price})  # fmt: skip
    return {"providers": providers, "models": models}


RoutingFactory = Callable[..., Ledger]


@pytest.fixture
def routing_ledger(home: Path, clock: Clock) -> Iterator[RoutingFactory]:
    """Ledgers over the routing catalog with a policy from camelCase keys."""
    opened: list[Ledger] = []

    def factory(**keys: Any) -> Ledger:
        base: dict[str, Any] = {"callsPerHour": 10_000, "sourceCalls": 1000, "sourceModels": 10}
        ledger = Ledger.open(
            home,
            policy=Policy.model_validate({**base, **keys}),
            catalog=Catalog.model_validate(routing_catalog()),
            env={},
            clock=clock,
            jitter=lambda: 0.0,
        )
        opened.append(ledger)
        return ledger

    yield factory
    for ledger in opened:
        ledger.close()
