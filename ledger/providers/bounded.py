"""Bounded HTTP exchanges for provider calls (R-HTTP-2, R-HTTP-3).

Invariant: every read here is bounded in bytes and in time. An error body is read for at most
ERROR_BODY_LIMIT bytes within about ERROR_BODY_BUDGET_S seconds and then dropped by the caller; a
success body is capped at SUCCESS_BODY_LIMIT and must arrive before the reservation deadline. No
read here ever blocks past its bound by more than one per-read timeout.
"""

from __future__ import annotations

import functools
import json
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import httpx

from ledger.providers.base import INVALID_RESPONSE, CallRequest, ProviderResponse

ERROR_BODY_LIMIT = 8192
ERROR_BODY_BUDGET_S = 0.2
SUCCESS_BODY_LIMIT = 16 * 1024 * 1024

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    httpx.HTTPError,
    httpx.InvalidURL,
    httpx.StreamError,
    OSError,
)
"""What a call can raise on the way to a provider; reported as `exception`, never re-raised."""

HEADER_ENCODING_MESSAGE = "a credential or header option cannot be sent over HTTP (value withheld)"
PROTOCOL_ERROR_MESSAGE = "the HTTP exchange broke the protocol (details withheld)"
"""The message of a detached httpx.ProtocolError: h11 quotes the offending wire bytes."""


@dataclass(frozen=True)
class JsonReply:
    """A 2xx reply whose body parsed as JSON (the adapter reads the wire shape)."""

    status: int
    data: object
    started: float
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Its lower-cased headers (the rate-limit ones are learned, R-TOK-4)."""

    def elapsed_ms(self) -> int:
        """Milliseconds since the call started."""
        return _elapsed_ms(self.started)

    def invalid(self) -> ProviderResponse:
        """The reply did not have the wire shape: a 2xx the worker treats as invalid output."""
        return invalid_response(self.status, self.started)


def _elapsed_ms(started: float) -> int:
    return max(0, int((time.monotonic() - started) * 1000))


def invalid_response(status: int, started: float) -> ProviderResponse:
    """A 2xx whose body is unparsable, oversized or of the wrong shape (`INVALID_RESPONSE`)."""
    return ProviderResponse(
        ok=False, status=status, stop_reason=INVALID_RESPONSE, elapsed_ms=_elapsed_ms(started)
    )


def detach(exc: BaseException) -> BaseException:
    """A copy of `exc` of the same type without its request, traceback or chained causes.

    httpx exceptions keep the request (whose headers hold the credential) and their traceback
    frames hold locals; the copy keeps only the type and the library's own short message. An HTTP
    parser error quotes the offending wire line (a provider's status or header line or body bytes,
    or our own header holding the credential), so its message is replaced by a fixed one.
    """
    args = (PROTOCOL_ERROR_MESSAGE,) if isinstance(exc, httpx.ProtocolError) else exc.args
    try:
        clean = type(exc)(*args)
    except Exception:
        clean = exc.with_traceback(None)
    clean.__cause__ = None
    clean.__context__ = None
    clean.__suppress_context__ = True
    return clean


def _set_read_timeout(response: httpx.Response, seconds: float) -> None:
    """Bound each further socket read of this response's body.

    httpx fixes timeouts when the request is sent; httpcore reads the request's `timeout`
    extension again when the body iteration starts, so updating it here bounds every body read.
    If a transport ignores it, the elapsed-time checks between chunks still apply.
    """
    try:
        timeouts = response.request.extensions.get("timeout")
    except RuntimeError:
        return
    if isinstance(timeouts, dict):
        timeouts["read"] = max(seconds, 0.001)


def read_error_body(
    response: httpx.Response,
    *,
    limit: int = ERROR_BODY_LIMIT,
    budget_s: float = ERROR_BODY_BUDGET_S,
) -> bytes:
    """Read at most `limit` raw bytes of a streamed response within ~`budget_s`, then close it."""
    started = time.monotonic()
    try:
        already_read = response.content  # e.g. a mock response built from bytes
    except httpx.ResponseNotRead:
        pass
    else:
        response.close()
        return already_read[:limit]
    # A short per-read timeout so a stalled body cannot hold us much past the budget.
    _set_read_timeout(response, budget_s / 2)
    body = bytearray()
    try:
        for chunk in response.iter_raw():
            body += chunk[: limit - len(body)]
            if len(body) >= limit or time.monotonic() - started >= budget_s:
                break
    except TRANSPORT_ERRORS:
        pass  # a cut or stalled error body: keep what arrived in time
    finally:
        response.close()
    return bytes(body)


def read_success_body(response: httpx.Response, *, limit: int, deadline: float) -> bytes | None:
    """The body of a 2xx reply, or None when it exceeds `limit` bytes.

    `deadline` is a time.monotonic() value; a body still arriving then raises httpx.ReadTimeout.
    """
    _set_read_timeout(response, deadline - time.monotonic())
    body = bytearray()
    try:
        for chunk in response.iter_bytes():
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("the reservation deadline passed while reading")
            body += chunk
            if len(body) > limit:
                return None
    finally:
        response.close()
    return bytes(body)


def lower_headers(headers: httpx.Headers) -> Mapping[str, str]:
    """Response headers with lower-cased names (repeated headers joined by a comma)."""
    merged: dict[str, str] = {}
    for name, value in headers.multi_items():
        key = name.lower()
        merged[key] = f"{merged[key]}, {value}" if key in merged else value
    return MappingProxyType(merged)


def post_json(
    client: httpx.Client | None,
    url: str,
    headers: Mapping[str, str],
    payload: object,
    *,
    deadline_ms: int,
    now_ms: Callable[[], int],
) -> ProviderResponse | JsonReply:
    """POST `payload` as JSON within the deadline; a failure as facts, or the parsed 2xx body."""
    started = time.monotonic()
    remaining_s = (deadline_ms - now_ms()) / 1000
    if remaining_s <= 0:
        # Never send a call whose reservation has already run out (R-HTTP-3).
        exc = httpx.TimeoutException("the reservation deadline passed before sending")
        return _transport_failure(exc, started)
    deadline = started + remaining_s
    content = json.dumps(payload).encode()
    try:
        if client is None:
            with httpx.Client(verify=_ssl_context(), follow_redirects=False) as own:
                return _exchange(own, url, headers, content, deadline, started)
        return _exchange(client, url, headers, content, deadline, started)
    except TRANSPORT_ERRORS as exc:
        return _transport_failure(detach(exc), started)
    except UnicodeError:
        # a credential or header option that HTTP cannot carry: a local fault, reported with a
        # fixed message (the offending value is never quoted), classified like any exception
        return _transport_failure(UnicodeError(HEADER_ENCODING_MESSAGE), started)


def post_and_parse(
    client: httpx.Client | None,
    url: str,
    headers: dict[str, str],
    payload: dict[str, Any],
    request: CallRequest,
    now_ms: Callable[[], int],
    parse: Callable[[JsonReply], ProviderResponse],
) -> ProviderResponse:
    """One call of a JSON API within the request's deadline: failures as facts, else `parse`."""
    reply = post_json(client, url, headers, payload, deadline_ms=request.deadline_ms, now_ms=now_ms)
    if isinstance(reply, ProviderResponse):
        return reply
    parsed = parse(reply)
    # a 2xx's headers go with its facts too: its rate-limit headers are learned (R-TOK-4)
    return replace(parsed, headers=reply.headers) if reply.headers else parsed


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One verified TLS context for the per-call clients (loading CA certificates is slow)."""
    return httpx.create_ssl_context()


def _transport_failure(exc: BaseException, started: float) -> ProviderResponse:
    return ProviderResponse(ok=False, status=None, exception=exc, elapsed_ms=_elapsed_ms(started))


def _exchange(
    client: httpx.Client,
    url: str,
    headers: Mapping[str, str],
    content: bytes,
    deadline: float,
    started: float,
) -> ProviderResponse | JsonReply:
    timeout = httpx.Timeout(max(deadline - time.monotonic(), 0.001))
    request_headers = {
        "content-type": "application/json",
        "accept": "application/json",
        # Raw bytes stay bounded: no compressed error body to inflate.
        "accept-encoding": "identity",
        **headers,
    }
    # Never follow a redirect, whatever client the caller handed in: httpx drops only
    # `Authorization` on a cross-origin redirect, so `x-api-key` and option headers would go
    # to the other host.
    with client.stream(
        "POST",
        url,
        headers=request_headers,
        content=content,
        timeout=timeout,
        follow_redirects=False,
    ) as response:
        status = response.status_code
        if not 200 <= status < 300:
            # Inspect status and headers before anything consumes the body (R-HTTP-2).
            error_headers = lower_headers(response.headers)
            body = read_error_body(response)
            return ProviderResponse(
                ok=False,
                status=status,
                headers=error_headers,
                error_body=body,
                elapsed_ms=_elapsed_ms(started),
            )
        success_headers = lower_headers(response.headers)
        raw = read_success_body(response, limit=SUCCESS_BODY_LIMIT, deadline=deadline)
    if raw is None:
        return invalid_response(status, started)
    try:
        data: object = json.loads(raw)
    except (ValueError, RecursionError):
        return invalid_response(status, started)
    return JsonReply(status=status, data=data, started=started, headers=success_headers)
