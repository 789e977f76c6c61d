"""The ASGI app: the routers, the one error handler, and the gate every request passes first.

The gate (a plain ASGI middleware, in this order): a draining service answers 503; a TCP request
without the bearer token answers 401 (compared in constant time; the unix socket's file mode is
its authentication); the body is read in full, at most 64 KiB (413) within `BODY_TIMEOUT_S`
(408), before any route runs, so no route ever waits on a client while it holds a transaction.
Every answer is counted for `/metrics` under its route template, never the raw path.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import anyio
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledger.api import Ledger
from ledger.service import admin, calls, ops, page_routes, queue_routes
from ledger.service.errors import error_response, install
from ledger.service.group_commit import GroupCommit
from ledger.service.models import finish_openapi

MAX_BODY_BYTES = 64 * 1024
BODY_TIMEOUT_S = 10.0
API_VERSION = "1"
PAGE_PATHS = frozenset({"/", "/page.css", "/page.js"})
PAGE_COOKIE = b"ledger_page"
STOPPED = "the service stopped before this request was answered; retry it"


def create_app(
    ledger: Ledger, *, token: str | None = None, draining: Callable[[], bool] = lambda: False
) -> FastAPI:
    """The service over one open `Ledger`; `token` guards TCP requests (None: socket only)."""
    app = FastAPI(
        title="ledger",
        version=API_VERSION,
        summary="Budgets, cooldowns and recovery for background LLM jobs, as a local service.",
        openapi_url="/v1/openapi.json",
        docs_url=None,  # the docs pages load scripts from a CDN; the service serves no asset
        redoc_url=None,
    )
    app.state.ledger = ledger
    app.openapi = lambda: app.openapi_schema or _openapi(app)  # type: ignore[method-assign]
    app.state.metrics = ops.RequestMetrics()
    app.state.group = GroupCommit(ledger.write_steps, observe=app.state.metrics.batch.observe)
    app.state.metrics.waiting.set_function(app.state.group.pending)
    app.state.metrics.in_progress.set_function(app.state.group.in_progress)
    for router in (calls.router, admin.router, queue_routes.router, ops.router, page_routes.router):
        app.include_router(router)
    install(app)
    app.add_middleware(Gate, token=token, draining=draining, metrics=app.state.metrics)
    return app


class Gate:
    """Drain, authenticate, bound the body, count: before any route (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        draining: Callable[[], bool],
        metrics: ops.RequestMetrics,
    ) -> None:
        self.app = app
        self.token = None if token is None else f"Bearer {token}".encode()
        self.draining = draining
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            if _is_sign_in(scope):
                await self._sign_in(scope, receive, counted)
                return
            refusal = self._refusal(scope)
            if refusal is None:
                body = await self._body(scope, receive)
                if isinstance(body, int):
                    refusal = body
                else:
                    await self.app(_as_json(scope), _replay(body, receive), counted)
            if refusal is not None:
                await error_response(refusal)(scope, receive, counted)
        except asyncio.CancelledError:
            if status:  # the answer had begun: nothing more can be said
                raise
            # stopped past --grace: the caller learns it was not served (and may retry with its
            # request id); the request ends here, no traceback is logged
            await error_response(503, "unavailable", STOPPED)(scope, receive, counted)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            elapsed = time.perf_counter() - started
            self.metrics.observe(scope["method"], template, status or 500, elapsed)

    def _refusal(self, scope: Scope) -> int | None:
        if self.draining():
            return 503
        server = scope.get("server")
        if server is not None and server[1] is not None:  # TCP (a unix socket has no port)
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            if self.token is None:
                return 401
            if hmac.compare_digest(given, self.token):
                return None
            if self._page_cookie_ok(scope, headers):
                return None
            return 401
        return None

    async def _sign_in(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`GET /?token=…` over TCP: with the right token, a session cookie for the page
        (HttpOnly, SameSite=Strict) and a redirect to `/`, so the token leaves the address bar;
        otherwise 401. The token is never echoed or logged."""
        given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[0]
        candidate = b"Bearer " + given.encode("utf-8", "replace")
        if self.token is None or not hmac.compare_digest(candidate, self.token):
            await error_response(401)(scope, receive, send)
            return
        cookie = (
            PAGE_COOKIE + b"=" + given.encode() + b"; HttpOnly; SameSite=Strict; Path=/"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [(b"location", b"/"), (b"set-cookie", cookie),
                            (b"cache-control", b"no-store"), (b"content-length", b"0")],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    def _page_cookie_ok(self, scope: Scope, headers: dict[bytes, bytes]) -> bool:
        """A browser shows the page with the session cookie that `/?token=…` set (GET of the page
        and its assets only: the API always wants the bearer header)."""
        if scope["method"] != "GET" or scope["path"] not in PAGE_PATHS or self.token is None:
            return False
        given = _cookie(headers.get(b"cookie", b""), PAGE_COOKIE)
        return given is not None and hmac.compare_digest(b"Bearer " + given, self.token)

    async def _body(self, scope: Scope, receive: Receive) -> bytes | int:
        """The whole body, or 413 (over 64 KiB) / 408 (not arrived within BODY_TIMEOUT_S)."""
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return 413 if length.isdigit() else 400
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(BODY_TIMEOUT_S):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return 400  # the client left
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    return 413
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        return 408


def _is_sign_in(scope: Scope) -> bool:
    """A browser's first visit over TCP: `GET /?token=…`."""
    server = scope.get("server")
    return (
        server is not None
        and server[1] is not None
        and scope["method"] == "GET"
        and scope["path"] == "/"
        and b"token=" in scope.get("query_string", b"")
    )


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document, built once: FastAPI's, finished by `models.finish_openapi`."""
    app.openapi_schema = finish_openapi(FastAPI.openapi(app))
    return app.openapi_schema


def _cookie(header: bytes, name: bytes) -> bytes | None:
    """One cookie's value from a Cookie header (None when absent)."""
    for part in header.split(b";"):
        key, _, value = part.strip().partition(b"=")
        if key == name:
            return value
    return None


def _as_json(scope: Scope) -> Scope:
    """Every body is JSON here, whatever the client labelled it (`curl -d` says form data)."""
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    scope["headers"] = [*headers, (b"content-type", b"application/json")]
    return scope


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then waits for a disconnect."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        message: dict[str, Any] = dict(await receive())
        return message

    return replay
