"""One upstream HTTP exchange for the gateway (R-HTTP-2, R-HTTP-3), on an async httpx client.

Invariant: an error response is inspected within its bounds (at most ERROR_BODY_LIMIT bytes read
within ERROR_BODY_BUDGET_S) and classified by ledger.classify; its body is then dropped and never
reaches the caller, a log or the ledger. The credential is read from the environment for the
request only and sent only to the route's own provider. No read outlives the reservation deadline.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpcore
import httpx

from ledger.api import Ledger
from ledger.catalog import Catalog, Model
from ledger.classify import Classification, classify_exception, classify_http
from ledger.gateway import network
from ledger.gateway.translate import request_for
from ledger.gateway.wire import (
    Format,
    Limits,
    fits_allowance,
    is_invalid,
    parse_reply,
    upstream_body,
    wants_usage,
)
from ledger.kinds import FailureKind
from ledger.providers.anthropic_messages import DEFAULT_VERSION
from ledger.providers.base import CallRequest, HttpAdapter, ProviderResponse
from ledger.providers.bounded import (
    ERROR_BODY_BUDGET_S,
    ERROR_BODY_LIMIT,
    HEADER_ENCODING_MESSAGE,
    SUCCESS_BODY_LIMIT,
    TRANSPORT_ERRORS,
    JsonReply,
)
from ledger.providers.openai_chat import max_tokens_field
from ledger.providers.registry import adapter_for
from ledger.routing.effort import anthropic_fields, openai_fields
from ledger.targets import Effort
from ledger.validation import Slot

USER_AGENT = "ledger-gateway"
"""Sent upstream with every gateway request (some providers' edges refuse a request without one)."""

UNSENDABLE = classify_exception(UnicodeError(HEADER_ENCODING_MESSAGE))
"""A request whose credential or header option HTTP cannot carry: the worker's classification of
the same fault (ledger.providers.bounded), so both fail it alike."""

UNFIT_ALLOWANCE = Classification(FailureKind.REQUEST_REJECTED, "exceeds_reply_allowance")
"""A request the route's reply allowance cannot serve (wire.fits_allowance: more choices than
tokens, or thinking without room for its minimum budget): not sent, since its reply could
outgrow the reservation's estimate or the provider would refuse it (another route, with a
larger allowance, may serve it, as the table permits)."""

MALFORMED = Classification(FailureKind.TRANSPORT, "malformed_reply")
"""A 2xx body or stream event without the wire shape: a cut, as R-GW-5 says for streams."""


@dataclass(frozen=True)
class Prepared:
    """One request ready to send to one route."""

    url: str
    headers: dict[str, str] = field(repr=False)
    body: dict[str, Any] = field(repr=False)
    fmt: Format  # the route's wire format
    caller: Format  # the caller's (the answer is translated when they differ, R-GW-3)
    fits: bool = True  # the route's reply allowance can serve it (wire.fits_allowance)
    usage_shown: bool = True  # a streaming caller asked to see usage (wire.wants_usage)


@dataclass(frozen=True)
class RouteFacts:
    """What a route's upstream request takes from catalog and policy alone (both immutable, read
    once per Ledger): worked out once per route, not per request. The credential is not here:
    the adapter reads it from the environment for each request."""

    fmt: Format
    url: str
    headers: dict[str, str] = field(repr=False)  # options, content type, API version
    adapter: HttpAdapter = field(repr=False)
    allowance: int
    max_tokens_name: str


_ROUTE_FACTS: Slot[str, tuple[Catalog, Mapping[str, str], RouteFacts]] = Slot("route facts")


def route_facts(ledger: Ledger, model: Model) -> RouteFacts:
    """The route's facts, from the policy's cache when this catalog and environment made them."""
    return ledger.policy.derived.value(
        _ROUTE_FACTS,
        model.key,
        lambda: (ledger.catalog, ledger.env, _make_route_facts(ledger, model)),
        lambda found: found[0] is ledger.catalog and found[1] is ledger.env,
    )[2]


def _make_route_facts(ledger: Ledger, model: Model) -> RouteFacts:
    provider = ledger.catalog.provider_for_call(model.provider)
    fmt = Format(provider.api)
    adapter = adapter_for(provider, ledger.env)
    assert isinstance(adapter, HttpAdapter)
    headers = adapter.option_headers()
    headers["content-type"] = "application/json"
    allowance = model.reply_reservation(ledger.policy.reply_tokens)
    if fmt is Format.ANTHROPIC:
        url = f"{adapter.base_url()}/v1/messages"
        headers["anthropic-version"] = adapter.option_str("anthropicVersion", DEFAULT_VERSION)
        name = "max_tokens"
    else:
        url = f"{adapter.base_url()}/chat/completions"
        # the field's name depends on the URL and the reasoning flag alone (no deadline here)
        probe = CallRequest(model.id, (), allowance, 0, bool(model.reasoning))
        name = max_tokens_field(probe, url)
    return RouteFacts(fmt, url, headers, adapter, allowance, name)


def prepare(
    ledger: Ledger,
    model: Model,
    caller: Format,
    body: dict[str, Any],
    effort: str | None = None,
) -> Prepared:
    """The route's URL, headers (its credential) and the caller's body for it (R-GW-3), in the
    route's wire format (translated over the common subset when it is the other one)."""
    route = route_facts(ledger, model)
    fmt = route.fmt
    usage_shown = wants_usage(caller, body)
    body = request_for(caller, fmt, body)
    headers = dict(route.headers)
    credential = route.adapter.credential()  # read now, for this request only
    if credential is not None:
        if fmt is Format.ANTHROPIC:
            headers["x-api-key"] = credential
        else:
            headers["authorization"] = f"Bearer {credential}"
    out = upstream_body(fmt, body, Limits(model.id, route.allowance, route.max_tokens_name))
    if effort is not None:  # R-RT-3: the route's own effort, never the primary's
        level = Effort(effort)
        if fmt is Format.ANTHROPIC:
            # inside the max_tokens actually sent (R-RT-3: the estimate covers it)
            out.update(anthropic_fields(level, int(out["max_tokens"])))
        else:
            out.update(openai_fields(level))
    fit = fits_allowance(fmt, body, route.allowance)
    return Prepared(route.url, headers, out, fmt, caller, fit, usage_shown)


@dataclass
class Reply:
    """What one non-streaming exchange gave: the answer document, or a classified failure."""

    document: dict[str, Any] | None
    facts: ProviderResponse | None
    failure: Classification | None
    elapsed_ms: int = 0


async def error_classification(response: httpx.Response, now_ms: int) -> Classification:
    """Classify an error response from at most ERROR_BODY_LIMIT bytes read within the budget."""
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(ERROR_BODY_BUDGET_S):
        try:
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size >= ERROR_BODY_LIMIT:
                    break
        except TRANSPORT_ERRORS:
            pass
    body = b"".join(chunks)[:ERROR_BODY_LIMIT]
    headers = {k.lower(): v for k, v in response.headers.items()}
    return classify_http(response.status_code, headers, body or None, now_ms)


def transport() -> httpx.AsyncHTTPTransport:
    """The service's pooled upstream connections. The gateway sends through the transport
    itself, not an `AsyncClient`: a relay uses none of the client's layers (auth flows,
    redirects, cookies, event hooks, default headers), which cost a streamed exchange 0.1 ms of
    CPU here (bench/results-gateway.md). No redirect is followed, no proxy or certificate
    setting is read from the environment, and no timeout is set below the caller's deadline
    (every exchange is bounded by its reservation's)."""
    return UpstreamTransport()


UPSTREAM_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)


class UpstreamTransport(httpx.AsyncHTTPTransport):
    """httpx's transport (its request and exception mapping) over a connection pool whose
    connections are the event loop's own streams (`ledger.gateway.network`), not anyio's."""

    def __init__(self) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=UPSTREAM_LIMITS.max_connections,
            max_keepalive_connections=UPSTREAM_LIMITS.max_keepalive_connections,
            keepalive_expiry=UPSTREAM_LIMITS.keepalive_expiry,
            network_backend=network.Backend(),
        )



def build_request(prepared: Prepared) -> httpx.Request | Classification:
    """The httpx request for a prepared exchange, or why the attempt fails without sending it:
    more than the route's reply allowance can serve (UNFIT_ALLOWANCE, wire.fits_allowance), or a
    credential or header option HTTP cannot carry (UNSENDABLE; the value is quoted nowhere,
    where httpx's error would name one of its characters)."""
    if not prepared.fits:
        return UNFIT_ALLOWANCE
    headers = {"user-agent": USER_AGENT, **prepared.headers}
    try:
        return httpx.Request("POST", _parsed(prepared.url), headers=headers,
                             content=json.dumps(prepared.body))  # fmt: skip
    except UnicodeError:
        return UNSENDABLE


@functools.lru_cache(maxsize=1024)
def _parsed(url: str) -> httpx.URL:
    """A route's URL parsed once (immutable; the catalog's URLs are few): parsing it took half
    of building each request (16 of 31 µs, measured)."""
    return httpx.URL(url)


async def send(upstream: httpx.AsyncBaseTransport, request: httpx.Request) -> httpx.Response:
    """The response head; its body is streamed (read it, then `aclose`)."""
    return await upstream.handle_async_request(request)


async def call(
    upstream: httpx.AsyncBaseTransport,
    prepared: Prepared,
    remaining_s: float,
    clock: Callable[[], int],
) -> Reply:
    """One non-streaming exchange, bounded by the reservation deadline (`remaining_s`)."""
    started = time.monotonic()
    try:
        with anyio.fail_after(max(0.001, remaining_s)):
            request = build_request(prepared)
            if isinstance(request, Classification):
                return Reply(None, None, request, _ms(started))
            response = await send(upstream, request)
            try:
                if response.status_code >= 300:
                    failure = await error_classification(response, clock())
                    return Reply(None, None, failure, _ms(started))
                data = await _bounded_body(response)
            finally:
                await response.aclose()
    except TimeoutError:
        return Reply(None, None, Classification(FailureKind.TRANSPORT, "timeout"), _ms(started))
    except TRANSPORT_ERRORS as exc:
        return Reply(None, None, classify_exception(exc), _ms(started))
    if data is None:
        return Reply(None, None, MALFORMED, _ms(started))
    facts = parse_reply(prepared.fmt, JsonReply(response.status_code, data, started))
    if is_invalid(facts) or not isinstance(data, dict):
        return Reply(None, None, MALFORMED, _ms(started))
    return Reply(data, facts, None, _ms(started))


async def _bounded_body(response: httpx.Response) -> object | None:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > SUCCESS_BODY_LIMIT:
            return None
        chunks.append(chunk)
    try:
        data: object = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        return None
    return data


def _ms(started: float) -> int:
    return max(0, int((time.monotonic() - started) * 1000))
