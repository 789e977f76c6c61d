"""The gate of the gateway paths (R-GW-1): drain, authenticate, bound the body, in the caller's
wire format, before any gateway route runs.

Authentication is the service's (R-SRV-1): the unix socket's file mode; on TCP the bearer token,
or a gateway key (SPEC 20) when the app has a `key_verifier`. Anthropic's `x-api-key` header is
read like a bearer. Tokens are compared in constant time and never logged or echoed. A key is
verified in a worker thread, never on the event loop (R-GW-8: its read, and the last-used note it
may hand on, would otherwise hold every other request up behind a busy database); the token is
compared on the loop, no thread involved. A TCP connection that showed a credential when the
authenticated pool is full is answered 503 `too_many_connections` with Retry-After (R-SRV-9).
The body is read in full (at most MAX_BODY_BYTES within BODY_TIMEOUT_S) before the route runs,
so no route waits on a slow client while it holds a reservation.

The gateway's own routes (`routes`: a method and an exact path) are then called straight from
here, as Starlette would call them but without matching every route of the app in turn or
FastAPI's parameter machinery (they take the plain request): arrival to endpoint fell from
0.58-0.77 ms to about 0.5 ms when measured. Any other path or method under the gateway's
prefixes is a 404 or 405 in the format's error shape (R-GW-6). An unexpected error inside a route
(a bug) is answered by the service's app (`ledger.service.app.ServiceApp`), which calls this gate
ahead of FastAPI's middleware: a 500 in the format's shape too (`error`), never the /v1 shape.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable, Iterable
from typing import Any

from starlette.requests import Request
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ledger.gateway.bodies import read_body, replay
from ledger.gateway.errors import RETRY_AFTER_S, TOO_MANY
from ledger.gateway.formats import registry
from ledger.gateway.formats.base import WireFormat

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Gateway bodies carry whole conversations and images: 4 MiB (the /v1 API keeps 64 KiB)."""
BODY_TIMEOUT_S = 10.0
KEY_STATE = "ledger_gateway_key"
"""Where the gate leaves the gateway key a request came with (scope state), for its scopes."""

MESSAGES: dict[int, tuple[str, str]] = {
    400: ("bad_request", "the request body did not arrive"),
    401: ("unauthorized", "a valid bearer token or gateway key is required"),
    408: ("request_timeout", "the request did not arrive in time"),
    404: ("not_found", "no such path in the gateway"),
    405: ("method_not_allowed", "method not allowed on this path"),
    413: ("body_too_large", "the request body is larger than 4 MiB"),
    500: ("internal_error", "internal error"),
    503: ("unavailable", "the service is not available"),
}


def format_of(scope: Scope) -> WireFormat | None:
    """The wire format of a gateway path (its registered prefix), None for every other path."""
    return registry.by_path(str(scope.get("path", "")))


async def error(fmt: WireFormat, status: int, send: Send, allow: str | None = None) -> None:
    """A gate refusal in the format's error shape (R-GW-6); `allow`: a 405's Allow header."""
    code, message = MESSAGES[status]
    body = json.dumps(fmt.error_document(status, code, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status in (408, 413):
        headers.append((b"connection", b"close"))
    if allow is not None:
        headers.append((b"allow", allow.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def too_many_document(fmt: WireFormat) -> bytes:
    """The body of a 503 `too_many_connections` in the format's error shape (R-SRV-9)."""
    return json.dumps(fmt.error_document(503, *TOO_MANY)).encode()


async def too_many(fmt: WireFormat, send: Send) -> None:
    """503 `too_many_connections` with Retry-After, and the connection closed (R-SRV-9)."""
    body = too_many_document(fmt)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GatewayGate:
    """Called by the service's gate for the gateway paths (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        draining: Any,
        authenticated: Callable[[Any], bool] = lambda client: True,
        routes: Iterable[BaseRoute] = (),
    ) -> None:
        self.app = app
        self.direct: dict[tuple[str, str], Route] = {
            (method, route.path): route
            for route in routes
            if isinstance(route, Route)
            for method in route.methods or ()
        }
        self.token = None if token is None else token.encode()
        self.draining = draining
        # the service's connection pools (R-SRV-9): a TCP connection that showed a credential
        # leaves the strangers' pool and its short deadline; False when its pool is full
        self.authenticated = authenticated

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fmt = format_of(scope)
        assert fmt is not None
        if self.draining():
            await error(fmt, 503, send)
            return
        if _is_tcp(scope):  # the unix socket: its mode is the authentication
            presented = _presented(dict(scope["headers"]))
            if presented is None or not (
                self._is_token(presented) or await self._is_key(scope, presented)
            ):
                await error(fmt, 401, send)
                return
            if not self.authenticated(scope.get("client")):
                await too_many(fmt, send)
                return
        body = await read_body(scope, receive, MAX_BODY_BYTES, BODY_TIMEOUT_S)
        if isinstance(body, int):
            await error(fmt, body, send)
            return
        replayed = replay(body, receive)
        route = self.direct.get((scope["method"], scope["path"]))
        if route is None:  # in the format's shape too (R-GW-6), never the /v1 API's
            allowed = sorted(m for m, path in self.direct if path == scope["path"])
            if allowed:
                await error(fmt, 405, send, ", ".join(allowed))
            else:
                await error(fmt, 404, send)
            return
        scope["route"] = route  # the metrics' route template, as the router would set it
        response = await route.endpoint(Request(scope, replayed))
        await response(scope, replayed, send)

    def _is_token(self, presented: bytes) -> bool:
        return self.token is not None and hmac.compare_digest(presented, self.token)

    async def _is_key(self, scope: Scope, presented: bytes) -> bool:
        """A gateway key the app's verifier accepts, asked in a worker thread (R-GW-8); its
        identity is left in the scope's state for the request's scopes."""
        app = scope.get("app")
        verifier = getattr(getattr(app, "state", None), "key_verifier", None)
        if verifier is None:
            return False
        text = presented.decode("utf-8", "replace")
        key = await asyncio.get_running_loop().run_in_executor(None, verifier, text)
        if key is None:
            return False
        scope.setdefault("state", {})[KEY_STATE] = key
        return True


def _is_tcp(scope: Scope) -> bool:
    server = scope.get("server")
    return server is not None and server[1] is not None


def _presented(headers: dict[bytes, bytes]) -> bytes | None:
    """The bearer token (or Anthropic's `x-api-key`) a request presents, if any."""
    auth = headers.get(b"authorization", b"")
    if auth[:7].lower() == b"bearer ":
        return auth[7:].strip()
    key = headers.get(b"x-api-key")
    return key.strip() if key else None
