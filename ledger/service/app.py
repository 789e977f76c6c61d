"""The ASGI app: the routers, the one error handler, and the gate every request passes first.

The gate (a plain ASGI middleware, for every path, in this order): a draining service answers
503; a TCP request without the bearer token (scheme case-insensitive, RFC 7235; compared in
constant time) answers 401, except the page and its assets with a live page session (R-SRV-10;
`/` without one shows how to sign in), and one with it when the authenticated pool is full 503
`too_many_connections` with Retry-After (R-SRV-9); the unix socket's file mode is its
authentication; a database file gone from its path answers 503 (a replaced one is reopened
first, R-SRV-10); the body is read in full, at most 64 KiB (413) within `BODY_TIMEOUT_S` (408),
before any route runs, so no route ever waits on a client while it holds a transaction. HEAD is
answered as GET without the body. Every answer is counted for `/metrics` under labels from fixed
sets (R-SRV-9): a known method or `other`, the route template, `unmatched` or `unauthenticated`,
never the raw path.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledger import gateway
from ledger.api import Ledger
from ledger.gateway.bodies import read_body, replay
from ledger.gateway.gate import error as gateway_error
from ledger.service import admin, calls, ops, page_routes, queue_routes
from ledger.service.db_watch import DatabaseWatch
from ledger.service.errors import error_response, install, too_many_response
from ledger.service.openapi import finish_openapi
from ledger.service.sessions import SESSION_COOKIE, PageSessions, sign_in_page
from ledger.store.group_commit import GroupCommit
from ledger.store.keys import LastUsed, verify_key

MAX_BODY_BYTES = 64 * 1024
BODY_TIMEOUT_S = 10.0
API_VERSION = "1"
PAGE_PATHS = frozenset({"/", "/page.css", "/page.js"})
UNWATCHED_PATHS = frozenset({"/healthz"})
"""Answered without looking at the database file (the process answers)."""
STOPPED = "the service stopped before this request was answered; retry it"
UNAUTHENTICATED_ROUTE = "unauthenticated"
UNMATCHED_ROUTE = "unmatched"
Authenticate = Callable[[tuple[str, int] | None], bool]


def create_app(
    ledger: Ledger,
    *,
    token: str | None = None,
    draining: Callable[[], bool] = lambda: False,
    token_hint: str = "the service's LEDGER_TOKEN",  # noqa: S107 - where it is, not a token
    authenticated: Authenticate = lambda client: True,
    announce: Callable[[str], None] = lambda line: None,
) -> FastAPI:
    """The service over one open `Ledger`; `token` guards TCP requests (None: socket only).
    `token_hint` says where the token is (never the token), `authenticated` is told of each TCP
    connection that showed a credential (False: no capacity for it, 503), `announce` prints one
    line (a reopened database)."""
    app = ServiceApp(
        title="ledger",
        version=API_VERSION,
        summary="Budgets, cooldowns and recovery for background LLM jobs, as a local service.",
        openapi_url="/v1/openapi.json",
        docs_url=None,  # the docs pages load scripts from a CDN; the service serves no asset
        redoc_url=None,
    )
    app.state.ledger = ledger
    # R-SC-3: the gateway's key check (a key never opens /v1 or the page; the Gate knows none);
    # called in a worker thread, its last-used write made later in one of its own (R-GW-8)
    app.state.key_verifier = partial(verify_key, ledger.db, touch=LastUsed(ledger.db).note)
    app.openapi = lambda: app.openapi_schema or _openapi(app)  # type: ignore[method-assign]
    app.state.metrics = ops.RequestMetrics()
    app.state.group = GroupCommit(ledger.write_steps, observe=app.state.metrics.batch.observe)
    app.state.metrics.waiting.set_function(app.state.group.pending)
    app.state.metrics.in_progress.set_function(app.state.group.in_progress)
    path = ledger.state.db_path if ledger.db.is_sqlite else None
    wal = ledger.db.journal_mode == "wal"
    app.state.db_watch = DatabaseWatch(path, ledger.db.dispose, announce, wal=wal)
    routers = (calls.router, admin.router, queue_routes.router, ops.router, page_routes.router)
    for router in (*routers, gateway.router):
        app.include_router(router)
    install(app)
    app.gate = Gate(
        partial(FastAPI.__call__, app),
        token=token,
        draining=draining,
        metrics=app.state.metrics,
        watch=app.state.db_watch,
        token_hint=token_hint,
        authenticated=authenticated,
        direct=calls.DirectCalls(app),
    )
    return app


class ServiceApp(FastAPI):
    """FastAPI with the gate in front of its whole stack: every HTTP request enters the gate
    first, and a gateway request goes from the gate straight to its route (`GatewayGate`), never
    through FastAPI's middleware layers (server errors, telemetry, its body limit, exceptions,
    exit stacks: five awaits a request, for nothing a gateway route uses), and so do reserve,
    settle and evolve with a valid body (`calls.DirectCalls`). Every other request goes on from
    the gate to FastAPI's stack as before. An error that escapes (a bug) is answered
    here: the JSON 500 FastAPI's error middleware gave when it stood in front, or for a gateway
    path the 500 in the caller's format."""

    gate: Gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self  # as Starlette sets it: the routes find the ledger in its state
        started = False

        async def answer(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.gate(scope, receive, answer)
        except Exception:  # a bug: a 500 with fixed text when nothing was said yet, then raised
            if not started:  # on for the server's log, as FastAPI's error middleware did
                fmt = gateway.format_of(scope)
                if fmt is not None:  # in the caller's wire format (R-GW-6)
                    await gateway_error(fmt, 500, send)
                else:
                    await error_response(500)(scope, receive, send)
            raise


class Gate:
    """Drain, authenticate, watch the file, bound the body, count: before any route (see the
    module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        draining: Callable[[], bool],
        metrics: ops.RequestMetrics,
        watch: DatabaseWatch,
        token_hint: str,
        authenticated: Authenticate,
        direct: calls.DirectCalls | None = None,
    ) -> None:
        self.app = app
        self.direct = direct
        self.token = None if token is None else token.encode()
        self.draining = draining
        self.metrics = metrics
        self.watch = watch
        self.token_hint = token_hint
        self.authenticated = authenticated
        self.sessions = PageSessions()
        self.gateway = gateway.GatewayGate(
            app,
            token=token,
            draining=draining,
            authenticated=authenticated,
            routes=gateway.router.routes,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0
        method = scope["method"]
        head = method == "HEAD"
        route_label: str | None = None

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif head and message["type"] == "http.response.body":
                message = {**message, "body": b""}  # HEAD: GET's answer without the body
            await send(message)

        try:
            if head:
                scope = {**scope, "method": "GET"}
            if _is_sign_in(scope):
                await self._sign_in(scope, receive, counted)
                return
            if gateway.format_of(scope) is not None:  # its own auth, body bound and error shape
                await self.gateway(scope, receive, counted)
                return
            refusal = self._refusal(scope)
            if refusal is not None and refusal.status_code == 401:
                route_label = UNAUTHENTICATED_ROUTE
                if scope["path"] == "/" and scope["method"] == "GET":
                    await self._sign_in_page(counted)
                    return
            if refusal is None and scope["path"] not in UNWATCHED_PATHS:
                problem = self.watch.check()
                if problem is not None and scope["path"] != "/readyz":
                    await error_response(503, "database_gone", problem)(scope, receive, counted)
                    return
            if refusal is None:
                body = await self._body(scope, receive)
                if isinstance(body, int):
                    refusal = error_response(body)
                elif self.direct is None or not await self.direct(
                    scope, body, replay(body, receive), counted
                ):
                    await self.app(_as_json(scope), replay(body, receive), counted)
            if refusal is not None:
                await refusal(scope, receive, counted)
        except asyncio.CancelledError:
            if status:  # the answer had begun: nothing more can be said
                raise
            # stopped past --grace: the caller learns it was not served (and may retry with its
            # request id); the request ends here, no traceback is logged
            await error_response(503, "unavailable", STOPPED)(scope, receive, counted)
        finally:
            if route_label is None:
                route = scope.get("route")
                route_label = getattr(route, "path", None) or UNMATCHED_ROUTE
            elapsed = time.perf_counter() - started
            self.metrics.observe(method, route_label, status or 500, elapsed)

    def _refusal(self, scope: Scope) -> Response | None:
        """Why the request is not let in (draining, no credential, no room), if it is not."""
        if self.draining():
            return error_response(503)
        if not _is_tcp(scope):
            return None
        headers = dict(scope["headers"])
        if self._bearer_ok(headers.get(b"authorization", b"")) or self._session_ok(
            scope, headers
        ):
            return None if self.authenticated(scope.get("client")) else too_many_response()
        return error_response(401)

    def _bearer_ok(self, given: bytes) -> bool:
        """`Bearer <token>`, the scheme in any case (RFC 7235), the token in constant time."""
        scheme, _, value = given.strip().partition(b" ")
        return (
            self.token is not None
            and scheme.lower() == b"bearer"
            and hmac.compare_digest(value.strip(), self.token)
        )

    async def _sign_in(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`GET /?token=…` over TCP: with the right token, a page session of its own (random,
        HttpOnly, SameSite=Strict, expiring; never the token) and a redirect to `/`, so the
        token leaves the address bar; otherwise 401. The token is never echoed or logged."""
        given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[0]
        candidate = given.encode("utf-8", "replace")
        if self.token is None or not hmac.compare_digest(candidate, self.token):
            await error_response(401)(scope, receive, send)
            return
        if not self.authenticated(scope.get("client")):
            await too_many_response()(scope, receive, send)
            return
        cookie = self.sessions.cookie(self.sessions.new())
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [(b"location", b"/"), (b"set-cookie", cookie),
                            (b"cache-control", b"no-store"), (b"content-length", b"0")],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    async def _sign_in_page(self, send: Send) -> None:
        """`GET /` over TCP without a credential: 401 with a small page saying how to sign in."""
        body = sign_in_page(self.token_hint)
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"text/html; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                    (b"content-security-policy", b"default-src 'none'"),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _session_ok(self, scope: Scope, headers: dict[bytes, bytes]) -> bool:
        """A browser shows the page with the session that `/?token=…` made (GET of the page
        and its assets only: the API always wants the bearer header)."""
        if scope["method"] != "GET" or scope["path"] not in PAGE_PATHS:
            return False
        return self.sessions.valid(_cookie(headers.get(b"cookie", b""), SESSION_COOKIE))

    async def _body(self, scope: Scope, receive: Receive) -> bytes | int:
        """The whole body, or 413 (over 64 KiB) / 408 (not arrived within BODY_TIMEOUT_S)."""
        return await read_body(scope, receive, MAX_BODY_BYTES, BODY_TIMEOUT_S)


def _is_tcp(scope: Scope) -> bool:
    """A TCP request (a unix socket has no port)."""
    server = scope.get("server")
    return server is not None and server[1] is not None


def _is_sign_in(scope: Scope) -> bool:
    """A browser's first visit over TCP: `GET /?token=…`."""
    return (
        _is_tcp(scope)
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
