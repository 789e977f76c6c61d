"""`POST /anthropic/v1/messages/count_tokens` (R-FMT-4): Claude Code asks it on every turn.

Not a reservation: it counts toward no call budget and settles nothing. The selection of the
named model (its chain's allowlist, R-RT-1/R-SEL-5, and the routes' cooldowns) gives the routes
in order; the body goes to the first whose wire format can count (`WireFormat.count_url`: an
Anthropic route), with the route's model id, credential and the beta flags its provider allows.
When no route can count it is 501 `not_supported`, never a made-up number (Claude Code then
estimates locally); when every route is cooling, 429 with Retry-After. An upstream failure is
answered in the caller's error shape with a fixed text, never the upstream's body.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import anyio
import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ledger.api import Ledger
from ledger.arguments import check_source_id
from ledger.errors import LedgerError, UsageError
from ledger.gateway import routing
from ledger.gateway.errors import GatewayError, refused
from ledger.gateway.formats.anthropic_messages import FORMAT
from ledger.gateway.formats.translate import betas_for
from ledger.gateway.upstream import USER_AGENT, route_facts, send, transport
from ledger.gateway.wire import DROPPED_HEADER, beta_flags
from ledger.providers.bounded import SUCCESS_BODY_LIMIT, TRANSPORT_ERRORS
from ledger.routing.chains import pool_members

PATH = "/anthropic/v1/messages/count_tokens"
TIMEOUT_S = 30.0
BAD_BODY = "the body must be a JSON object with a string `model` and a list `messages`"
NOT_SUPPORTED = (
    "no route of this model can count tokens (only Anthropic-format routes can): estimate"
    " locally"
)
UPSTREAM_FAILED = "the upstream provider did not count the tokens"


def _answer(error: GatewayError) -> JSONResponse:
    headers = {} if error.retry_after_s is None else {"retry-after": str(error.retry_after_s)}
    document = FORMAT.error_document(error.status, error.code, error.message)
    return JSONResponse(document, status_code=error.status, headers=headers)


async def serve(request: Request) -> Response:
    """Count a messages body's input tokens on a route that can (see the module docstring)."""
    ledger: Ledger = request.app.state.ledger
    try:
        return await _count(request, ledger)
    except GatewayError as error:
        return _answer(error)
    except UsageError as error:  # fixed text by construction
        return _answer(GatewayError(400, "bad_request", str(error)))
    except LedgerError as error:
        return _answer(GatewayError(503, "unavailable", type(error).__doc__ or "busy"))


def _counting_routes(ledger: Ledger, routes: list[str]) -> list[str]:
    """The selection's routes as concrete model keys whose format can count, in order."""
    found: list[str] = []
    for route in routes:
        for member in pool_members(ledger.policy, route):
            model = ledger.catalog.model(member.key)
            if model is None or member.key in found:
                continue
            facts = route_facts(ledger, model)
            if facts.fmt.count_url(facts.url) is not None:
                found.append(member.key)
    return found


async def _count(request: Request, ledger: Ledger) -> Response:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise GatewayError(400, "invalid_json", "the body is not valid JSON") from None
    if not (
        isinstance(body, dict)
        and isinstance(body.get("model"), str)
        and body["model"]
        and isinstance(body.get("messages"), list)
    ):
        raise GatewayError(400, "invalid_request", BAD_BODY)
    model = routing.resolve_model(ledger, body["model"])
    routing.check_kind(ledger, model, FORMAT)
    source = request.headers.get("x-ledger-source") or f"gw-{secrets.token_hex(8)}"
    try:
        check_source_id(source)
    except UsageError:
        raise GatewayError(400, "bad_source", "X-Ledger-Source must be a source id") from None
    selection = await anyio.to_thread.run_sync(
        lambda: ledger.select(source, model=model, input_bytes=len(raw))
    )
    routes = _counting_routes(ledger, list(selection.routes))
    if not routes:
        if not selection.routes and selection.retry_at_ms is not None:
            reason = next((str(e.reason) for e in selection.excluded if e.model == model), "")
            subject = routing.refusal_subject(ledger, reason, model)
            raise refused(reason or "no_route", subject, selection.retry_at_ms,
                          ledger.clock_fn())  # fmt: skip
        raise GatewayError(501, "not_supported", NOT_SUPPORTED)
    key = routes[0]
    flags = beta_flags(request.headers.get(FORMAT.beta_header or ""))
    return await _forward(request, ledger, key, body, flags)


async def _bounded(response: httpx.Response) -> bytes | None:
    """The body, or None past SUCCESS_BODY_LIMIT bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > SUCCESS_BODY_LIMIT:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _forward(
    request: Request, ledger: Ledger, key: str, body: dict[str, Any], flags: tuple[str, ...]
) -> Response:
    model = ledger.catalog.require_model(key)
    facts = route_facts(ledger, model)
    url = facts.fmt.count_url(facts.url)
    assert url is not None
    headers = {"user-agent": USER_AGENT, **facts.headers}
    credential = facts.adapter.credential()
    if credential is not None:
        name, value = facts.fmt.credential_header(credential)
        headers[name] = value
    allows = ledger.catalog.providers[model.provider].allows_beta
    forwarded, dropped = betas_for(FORMAT, facts.fmt, flags, allows)
    if forwarded and facts.fmt.beta_header is not None:
        headers[facts.fmt.beta_header] = ",".join(forwarded)
    state = request.app.state
    upstream = getattr(state, "gateway_upstream", None)
    if upstream is None:  # made on first use, on the event loop (as endpoints.context_of)
        upstream = state.gateway_upstream = transport()
    content = json.dumps({**body, "model": model.id})
    try:
        with anyio.fail_after(TIMEOUT_S):
            response = await send(upstream, httpx.Request("POST", url, headers=headers,
                                                          content=content))  # fmt: skip
            try:
                data = await _bounded(response) if response.status_code < 300 else b""
            finally:
                await response.aclose()
    except (TimeoutError, UnicodeError):
        raise GatewayError(502, "upstream_unavailable", UPSTREAM_FAILED) from None
    except TRANSPORT_ERRORS:
        raise GatewayError(502, "upstream_unavailable", UPSTREAM_FAILED) from None
    if response.status_code == 429:
        raise GatewayError(429, "rate_limit", UPSTREAM_FAILED)
    if response.status_code >= 300 or data is None:
        raise GatewayError(502, "upstream_error", UPSTREAM_FAILED)
    try:
        counted = json.loads(data)
        tokens = counted["input_tokens"]
    except (ValueError, KeyError, TypeError):
        raise GatewayError(502, "upstream_error", UPSTREAM_FAILED) from None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise GatewayError(502, "upstream_error", UPSTREAM_FAILED)
    answer = {"x-ledger-model": key}
    if dropped:
        answer[DROPPED_HEADER] = ",".join(dropped)
    return JSONResponse({"input_tokens": tokens}, headers=answer)
