"""A real `ledger serve` over stand-in routes of every wire format, for the Responses endpoint's
tests (R-FMT-2): two native Responses providers (`rapid` r1, `rover` r2), an OpenAI chat one
(`acme` a1) and an Anthropic one (`bolt` b1), all on one stand-in. By price r1 < a1 < r2 < b1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ledger.standin.server import StandIn
from tests.support.gateway_setup import STANDIN_KEY, Gateway
from tests.support.serving import running


def responses_catalog(standin: StandIn) -> dict[str, Any]:
    def model(provider: str, ident: str, price: int) -> dict[str, Any]:
        return {"provider": provider, "id": ident, "contextWindow": 100000,
                "maxOutputTokens": 4096,
                "pricing": [{"inputUsdPerMTok": price, "outputUsdPerMTok": 2 * price}]}  # fmt: skip

    return {
        "providers": {
            "rapid": {"available": True, "api": "openai-responses",
                      "baseUrl": standin.base_url_openai},
            "rover": {"available": True, "api": "openai-responses",
                      "baseUrl": standin.base_url_openai},
            "acme": {"available": True, "api": "openai-chat", "baseUrl": standin.base_url_openai},
            "bolt": {"credentialEnv": "BOLT_KEY", "api": "anthropic-messages",
                     "baseUrl": standin.base_url_anthropic},
        },
        "models": [model("rapid", "r1", 1), model("acme", "a1", 2), model("rover", "r2", 3),
                   model("bolt", "b1", 4)],
    }  # fmt: skip


@contextmanager
def responses_gateway(home: Path, standin: StandIn, **policy: Any) -> Iterator[Gateway]:
    """`ledger serve --listen 127.0.0.1:0` over the catalog above."""
    (home / "catalog.json").write_text(json.dumps(responses_catalog(standin)))
    if policy:
        (home / "recovery.json").write_text(json.dumps(policy))
    with running(home, "--listen", "127.0.0.1:0", env={"BOLT_KEY": STANDIN_KEY}) as served:
        gw = Gateway(served, standin)
        try:
            yield gw
        finally:
            gw.close()
