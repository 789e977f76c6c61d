"""One gateway request in this process, through the service's own app (the gate, the routes, the
group commit): for `ledger demo`, which has no service running. The same code path as a request
to `ledger serve`, minus the HTTP server in front of it."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any

import httpx

from ledger.api import Ledger
from ledger.service.app import create_app


@dataclass(frozen=True)
class Shown:
    """What one gateway request answered (no text: never a body)."""

    status: int
    model: str | None
    attempts: str | None
    reservation: str | None
    code: str | None

    def line(self, asked: str) -> str:
        """One line for the demo's output."""
        if self.status == 200:
            return (f"POST /openai/v1/chat/completions model={asked} -> 200, answered by "
                    f"{self.model} after {self.attempts} attempt(s), reservation "
                    f"#{self.reservation}")  # fmt: skip
        return f"POST /openai/v1/chat/completions model={asked} -> {self.status} {self.code}"


def one_request(ledger: Ledger, model: str, source: str, text: str) -> Shown:
    """Send one OpenAI-format chat request through the gateway of an app over `ledger`."""
    token = secrets.token_hex(16)
    app = create_app(ledger, token=token)
    body = {"model": model, "messages": [{"role": "user", "content": text}]}

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        headers = {"authorization": f"Bearer {token}", "x-ledger-source": source}
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                return await c.post("/openai/v1/chat/completions", json=body, headers=headers)
        finally:
            upstream: Any = getattr(app.state, "gateway_upstream", None)
            if upstream is not None:
                await upstream.aclose()

    try:
        answer = asyncio.run(go())
    finally:
        app.state.group.close()
    error = answer.json().get("error") if answer.status_code != 200 else None
    return Shown(
        answer.status_code,
        answer.headers.get("x-ledger-model"),
        answer.headers.get("x-ledger-attempts"),
        answer.headers.get("x-ledger-reservation"),
        error.get("code") if isinstance(error, dict) else None,
    )
