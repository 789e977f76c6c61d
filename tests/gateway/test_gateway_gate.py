"""R-GW-1: the gateway's gate, in process through the service's own app: on TCP the bearer token,
Anthropic's `x-api-key`, or a gateway key the app's `key_verifier` accepts (which opens only the
gateway paths, never `/v1`); every refusal in the caller's format."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
import pytest

from ledger.gateway import endpoints
from ledger.service.app import create_app
from tests.support.ledgers import LedgerFactory

TOKEN = "service-token-for-the-test-0123"


@dataclass(frozen=True)
class Key:
    name: str
    scopes: tuple[str, ...]


def _ask(
    app: object,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes = b"{}",
    raise_errors: bool = True,
) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(
            app=app,  # type: ignore[arg-type]
            raise_app_exceptions=raise_errors,
        )
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            return await c.request(method, path, headers=headers, content=body)

    return asyncio.run(go())


def test_r_gw_1_gateway_key_opens_the_gateway_only(make_ledger: LedgerFactory) -> None:
    app = create_app(make_ledger(), token=TOKEN)
    seen: list[str] = []

    def verifier(presented: str) -> Key | None:
        seen.append(presented)
        return Key("ci", ("team-a",)) if presented == "gk-valid-key" else None

    app.state.key_verifier = verifier
    try:
        listed = _ask(app, "GET", "/openai/v1/models", {"authorization": "Bearer gk-valid-key"})
        assert listed.status_code == 200
        via_x = _ask(app, "GET", "/openai/v1/models", {"x-api-key": "gk-valid-key"})
        assert via_x.status_code == 200
        wrong = _ask(app, "POST", "/anthropic/v1/messages", {"x-api-key": "gk-wrong"})
        assert wrong.status_code == 401
        assert wrong.json()["type"] == "error"
        assert wrong.json()["error"]["code"] == "unauthorized"
        assert "gk-wrong" not in wrong.text
        v1 = _ask(app, "GET", "/v1/status", {"authorization": "Bearer gk-valid-key"})
        assert v1.status_code == 401  # a gateway key never opens /v1
        token = _ask(app, "GET", "/openai/v1/models", {"x-api-key": TOKEN})
        assert token.status_code == 200
        assert TOKEN not in seen  # the service token is recognised before any key lookup
    finally:
        app.state.group.close()


def test_r_gw_1_without_a_verifier_only_the_token_opens_it(make_ledger: LedgerFactory) -> None:
    app = create_app(make_ledger(), token=TOKEN)
    try:
        answer = _ask(app, "POST", "/openai/v1/chat/completions", {"authorization": "Bearer x"})
        assert answer.status_code == 401
        assert set(answer.json()["error"]) >= {"message", "type", "code"}
        ok = _ask(app, "GET", "/openai/v1/models", {"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
    finally:
        app.state.group.close()


def test_r_gw_6_an_unexpected_error_in_a_route_is_a_500_in_the_format_shape(
    make_ledger: LedgerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service calls the gate ahead of FastAPI's middleware (ServiceApp), so a bug inside a
    gateway route is answered here: a 500 in the caller's format with fixed text, never
    FastAPI's plain text, the /v1 shape or the exception's text."""
    marker = "secret-marker-in-an-exception"

    def broken(*_args: object) -> None:
        raise RuntimeError(marker)

    monkeypatch.setattr(endpoints, "_parse", broken)
    app = create_app(make_ledger(), token=TOKEN)
    auth = {"authorization": f"Bearer {TOKEN}"}
    try:
        for path, shape in (("/openai/v1/chat/completions", "openai"),
                            ("/anthropic/v1/messages", "anthropic")):  # fmt: skip
            answer = _ask(app, "POST", path, auth, body=b'{"model": "x"}', raise_errors=False)
            assert answer.status_code == 500
            assert answer.headers["content-type"] == "application/json"
            document = answer.json()
            assert document["error"]["code"] == "internal_error"
            if shape == "anthropic":
                assert document["type"] == "error"
            assert marker not in answer.text
    finally:
        app.state.group.close()


def test_r_srv_6_an_error_in_the_gate_itself_is_the_json_500(
    make_ledger: LedgerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate stands in front of FastAPI's error middleware now: an error escaping it is still
    the service's JSON 500 with fixed text, for the /v1 API and the gateway alike."""
    from ledger.service import app as app_module

    marker = "secret-marker-in-the-gate"

    def broken(_scope: object) -> bool:
        raise RuntimeError(marker)

    monkeypatch.setattr(app_module, "_is_sign_in", broken)
    app = create_app(make_ledger(), token=TOKEN)
    auth = {"authorization": f"Bearer {TOKEN}"}
    try:
        for path in ("/v1/status", "/openai/v1/models"):
            answer = _ask(app, "GET", path, auth, raise_errors=False)
            assert answer.status_code == 500
            assert answer.json()["error"]["code"] == "internal_error"
            assert marker not in answer.text
    finally:
        app.state.group.close()
