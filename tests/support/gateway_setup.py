"""A stand-in upstream and a real `ledger serve` for the gateway tests (SPEC section 19)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import openai

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from tests.support.serving import Served, running

STANDIN_KEY = "standin-upstream-key-not-a-secret"


def gateway_catalog(standin: StandIn) -> dict[str, Any]:
    """Two OpenAI-format providers and two Anthropic-format ones, all on the stand-in; by price
    (R-SEL-6) a1 < c1 < b1 < d1, so an OpenAI primary's default backup is c1."""
    return {
        "providers": {
            "acme": {"available": True, "api": "openai-chat", "baseUrl": standin.base_url_openai},
            "cirrus": {"available": True, "api": "openai-chat",
                       "baseUrl": standin.base_url_openai},
            "bolt": {"credentialEnv": "BOLT_KEY", "api": "anthropic-messages",
                     "baseUrl": standin.base_url_anthropic},
            "delta": {"credentialEnv": "BOLT_KEY", "api": "anthropic-messages",
                      "baseUrl": standin.base_url_anthropic},
        },
        "models": [
            {"provider": "acme", "id": "a1", "contextWindow": 100000, "maxOutputTokens": 4096,
             "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}]},
            {"provider": "cirrus", "id": "c1", "contextWindow": 100000, "maxOutputTokens": 4096,
             "pricing": [{"inputUsdPerMTok": 2, "outputUsdPerMTok": 4}]},
            {"provider": "bolt", "id": "b1", "contextWindow": 100000, "maxOutputTokens": 4096,
             "pricing": [{"inputUsdPerMTok": 3, "outputUsdPerMTok": 6}]},
            {"provider": "delta", "id": "d1", "contextWindow": 100000, "maxOutputTokens": 4096,
             "pricing": [{"inputUsdPerMTok": 4, "outputUsdPerMTok": 8}]},
        ],
    }  # fmt: skip


@dataclass
class Gateway:
    """The running service and its upstream."""

    served: Served
    standin: StandIn
    clients: list[openai.OpenAI | anthropic.Anthropic] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.served.url is not None
        return self.served.url

    @property
    def token(self) -> str:
        assert self.served.token is not None
        return self.served.token

    def openai(self, **headers: str) -> openai.OpenAI:
        client = openai.OpenAI(
            base_url=self.url + "/openai/v1", api_key=self.token, max_retries=0,
            default_headers=headers or None, timeout=60,
        )  # fmt: skip
        self.clients.append(client)
        return client

    def anthropic(self, **headers: str) -> anthropic.Anthropic:
        client = anthropic.Anthropic(
            base_url=self.url + "/anthropic", api_key=self.token, max_retries=0,
            default_headers=headers or None, timeout=60,
        )  # fmt: skip
        self.clients.append(client)
        return client

    def close(self) -> None:
        """Close every SDK client made here (no socket left for the garbage collector)."""
        for client in self.clients:
            client.close()

    def models_asked(self) -> list[str | None]:
        return [r.model for r in self.standin.requests]


@contextmanager
def gateway(home: Path, standin: StandIn, **policy: Any) -> Iterator[Gateway]:
    """`ledger serve --listen 127.0.0.1:0` over a catalog of stand-in routes."""
    (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
    if policy:
        (home / "recovery.json").write_text(json.dumps(policy))
    with running(home, "--listen", "127.0.0.1:0", env={"BOLT_KEY": STANDIN_KEY}) as served:
        gw = Gateway(served, standin)
        try:
            yield gw
        finally:
            gw.close()


def streamed_attempts(home: Path, reply: Scripted) -> tuple[httpx.Response, list[tuple[Any, ...]]]:
    """One streamed OpenAI-format request through a gateway whose stand-in always sends `reply`:
    the answer, and each reservation's (status, subkind)."""
    with StandIn(default=reply) as standin, gateway(home, standin) as gw:
        answer = httpx.post(gw.url + "/openai/v1/chat/completions", timeout=60,
                            headers={"authorization": f"Bearer {gw.token}"},
                            json={"model": "acme/a1", "stream": True,
                                  "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT status, subkind FROM reservations").all()
    return answer, [tuple(r) for r in rows]


# An upstream nobody listens on (port 9, discard) and a minimal chat completion: for tests that
# drive the gateway's loop with a scripted exchange instead of a stand-in.
UNREACHED_UPSTREAM = SimpleNamespace(
    base_url_openai="http://127.0.0.1:9/v1", base_url_anthropic="http://127.0.0.1:9"
)
MINIMAL_COMPLETION = {"id": "x", "object": "chat.completion", "model": "a1", "choices": []}
