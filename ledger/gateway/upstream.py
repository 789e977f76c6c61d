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
from ledger.gateway.formats import registry
from ledger.gateway.formats.base import Limits, WireFormat
from ledger.gateway.formats.translate import betas_for, dropped_for, native, request_for
from ledger.gateway.wire import is_invalid
from ledger.kinds import FailureKind
from ledger.learned import LearnedLimits, read_limits
from ledger.providers.base import HttpAdapter, ProviderResponse
from ledger.providers.bounded import (
    ERROR_BODY_BUDGET_S,
    ERROR_BODY_LIMIT,
    HEADER_ENCODING_MESSAGE,
    SUCCESS_BODY_LIMIT,
    TRANSPORT_ERRORS,
    JsonReply,
)
from ledger.providers.registry import adapter_for
from ledger.targets import Effort
from ledger.validation import Slot

USER_AGENT = "ledger-gateway"
"""Sent upstream with every gateway request (some providers' edges refuse a request without one)."""

UNSENDABLE = classify_exception(UnicodeError(HEADER_ENCODING_MESSAGE))
"""A request whose credential or header option HTTP cannot carry: the worker's classification of
the same fault (ledger.providers.bounded), so both fail it alike."""

UNFIT_ALLOWANCE = Classification(FailureKind.REQUEST_REJECTED, "exceeds_reply_allowance")
"""A request the route's reply allowance cannot serve (its format's `fits_allowance`: more
choices than tokens, or thinking without room for its minimum budget): not sent, since its reply
could outgrow the reservation's estimate or the provider would refuse it (another route, with a
larger allowance, may serve it, as the table permits)."""

MALFORMED = Classification(FailureKind.TRANSPORT, "malformed_reply")
"""A 2xx body or stream event without the wire shape: a cut, as R-GW-5 says for streams."""


@dataclass(frozen=True)
class Prepared:
    """One request ready to send to one route."""

    url: str
    headers: dict[str, str] = field(repr=False)
    body: dict[str, Any] = field(repr=False)
    fmt: WireFormat  # the route's wire format
    caller: WireFormat  # the caller's (the answer is translated when they differ, R-GW-3)
    fits: bool = True  # the route's reply allowance can serve it (fmt.fits_allowance)
    usage_shown: bool = True  # a streaming caller asked to see usage (caller.wants_usage)
    keep: bool = False  # a native route keeps the answer: record its id (R-FMT-2)
    dropped: tuple[str, ...] = ()  # hints and flags this route does not get (R-FMT-4)
    learn: bool = True  # read the token limits its answer reports (R-TOK-4, `learnLimits`)


@dataclass(frozen=True)
class RouteFacts:
    """What a route's upstream request takes from catalog and policy alone (both immutable, read
    once per Ledger): worked out once per route, not per request. The credential is not here:
    the adapter reads it from the environment for each request."""

    fmt: WireFormat
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
    fmt = registry.for_route(provider.api, model.serves)
    if fmt is None:
        raise ValueError(f"no wire format {provider.api!r} is registered")
    adapter = adapter_for(provider, ledger.env)
    assert isinstance(adapter, HttpAdapter)
    headers = adapter.option_headers()
    headers["content-type"] = "application/json"
    allowance = model.reply_reservation(ledger.policy.reply_tokens)
    parts = fmt.upstream_route(adapter, model, allowance)
    headers.update(parts.headers)
    return RouteFacts(fmt, parts.url, headers, adapter, allowance, parts.max_tokens_field)


def prepare(
    ledger: Ledger,
    model: Model,
    caller: WireFormat,
    body: dict[str, Any],
    effort: str | None = None,
    betas: tuple[str, ...] = (),
) -> Prepared:
    """The route's URL, headers (its credential) and the caller's body for it (R-GW-3), in the
    route's wire format (translated through the internal form when it is another one); the
    caller's beta flags its provider allows, the rest dropped and reported (R-FMT-4)."""
    route = route_facts(ledger, model)
    fmt = route.fmt
    usage_shown = caller.wants_usage(body)
    same = native(fmt, caller)
    keep = same and caller.stores(body)
    dropped = dropped_for(caller, fmt, body)
    if effort is None and not same and model.reasoning is not False:
        effort = caller.requested_effort(body)  # the route's own effort wins (R-RT-3)
    sent = request_for(caller, fmt, body)
    translated, body = sent is not body, sent
    headers = dict(route.headers)
    if betas:
        allows = ledger.catalog.providers[model.provider].allows_beta
        forwarded, refused = betas_for(caller, fmt, betas, allows)
        if forwarded:
            assert fmt.beta_header is not None
            headers[fmt.beta_header] = ",".join(forwarded)
        dropped += refused
    credential = route.adapter.credential()  # read now, for this request only
    if credential is not None:
        name, value = fmt.credential_header(credential)
        headers[name] = value
    out = fmt.upstream_body(body, Limits(model.id, route.allowance, route.max_tokens_name))
    if translated and model.reasoning is False:  # a caller's thinking, for a model that has
        for name in fmt.effort_fields(Effort.LOW, out):  # no reasoning: not sent (R-FMT-4)
            out.pop(name, None)
    if effort is not None:  # R-RT-3: the route's own effort, never the primary's
        out.update(fmt.effort_fields(Effort(effort), out))
    fit = fmt.fits_allowance(body, route.allowance)
    learn = ledger.policy.learn_limits
    return Prepared(route.url, headers, out, fmt, caller, fit, usage_shown, keep, dropped, learn)


@dataclass
class Reply:
    """What one non-streaming exchange gave: the answer document, or a classified failure."""

    document: dict[str, Any] | None
    facts: ProviderResponse | None
    failure: Classification | None
    elapsed_ms: int = 0
    limits: LearnedLimits | None = None  # the token limits its answer reported (R-TOK-4)


def heard(prepared: Prepared, response: httpx.Response, now_ms: int) -> LearnedLimits | None:
    """R-TOK-4: the token limits an answer's headers report, success or failure, read when its
    head arrived (None under `"learnLimits": false`)."""
    return read_limits(response.headers, now_ms) if prepared.learn else None


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
    more than the route's reply allowance can serve (UNFIT_ALLOWANCE, fits_allowance), or a
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
            limits = heard(prepared, response, clock())
            try:
                if response.status_code >= 300:
                    failure = await error_classification(response, clock())
                    return Reply(None, None, failure, _ms(started), limits)
                data = await _bounded_body(response)
            finally:
                await response.aclose()
    except TimeoutError:
        return Reply(None, None, Classification(FailureKind.TRANSPORT, "timeout"), _ms(started))
    except TRANSPORT_ERRORS as exc:
        return Reply(None, None, classify_exception(exc), _ms(started))
    if data is None:
        return Reply(None, None, MALFORMED, _ms(started), limits)
    facts = prepared.fmt.parse_reply(JsonReply(response.status_code, data, started))
    if is_invalid(facts) or not isinstance(data, dict):
        return Reply(None, None, MALFORMED, _ms(started), limits)
    return Reply(data, facts, None, _ms(started), limits)


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
