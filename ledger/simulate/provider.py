"""The in-process provider stand-in of a simulation (R-SIM-1): no network, no sleeps.

A `Reply` says how one call goes (a policy-table kind and subkind as the ledger records them,
latency, tokens, a Retry-After hint). `call_result` turns it into the RAW facts a real adapter
would return (HTTP status, a known error code in a JSON body, a Retry-After header, a transport
exception, a stop reason, reply text) and hands them to the real built-in handler, so the real
classifier, policy table and worker decide everything — the stand-in never classifies.

A reply may carry what the provider reports left of its token limit (`TokenReading`, from a
scenario's `tokensPerMinute`): every answer with an HTTP status then carries the rate-limit
headers of the provider's wire format (OpenAI's `x-ratelimit-*-tokens` with the reset as a
duration such as `6s`, Anthropic's `anthropic-ratelimit-tokens-*` with the reset as an RFC 3339
time), computed on the virtual clock as the answer arrives, so the worker learns the limit as it
would from a live provider (R-TOK-4).

Invariant: the virtual clock advances by the call's latency (at most to the reservation's
deadline: a slower call is the timeout a real adapter would report).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import httpx

from ledger.classify import KNOWN_ERROR_CODES
from ledger.kinds import FailureKind
from ledger.providers.base import ProviderResponse
from ledger.simulate.vclock import VirtualClock
from ledger.standin.ratelimits import headers as limit_headers
from ledger.worker.handler import Job, echo_handler
from ledger.worker.queue import HandlerResult

OK_TEXT = '{"simulated": true}'
BAD_JSON = '{"simulated": '

_STATUS_OF_KIND: dict[FailureKind, int] = {
    FailureKind.AUTH: 401,
    FailureKind.QUOTA: 402,
    FailureKind.RATE_LIMIT: 429,
    FailureKind.TRANSPORT: 503,
    FailureKind.REQUEST_REJECTED: 400,
    FailureKind.UNKNOWN: 409,
}
_EXCEPTIONS: dict[str, type[Exception]] = {
    "timeout": httpx.ReadTimeout,
    "connect_error": httpx.ConnectError,
    "protocol_error": httpx.RemoteProtocolError,
    "stream_cut": httpx.ReadError,
    "write_error": httpx.WriteError,
    "network_error": httpx.NetworkError,
    "proxy_error": httpx.ProxyError,
}
_STOPS = {"length_stop": "length", "incomplete_stop": "pause_turn", "unrecognised_stop": "odd"}


@dataclass(frozen=True)
class TokenReading:
    """What a provider reports of its token limit on one answer: `left` until `reset_at_ms`
    (virtual UTC ms, when its window is whole again), of `limit`."""

    left: int
    reset_at_ms: int
    limit: int


@dataclass(frozen=True)
class Reply:
    """How one simulated call goes: `kind` None is a success."""

    kind: FailureKind | None = None
    subkind: str | None = None
    reason: str | None = None
    latency_ms: int = 1000
    input_tokens: int | None = None
    output_tokens: int | None = None
    retry_after_ms: int | None = None
    status: int | None = None
    """An explicit HTTP status (scenarios); otherwise derived from kind and subkind."""
    reading: TokenReading | None = None
    """The provider's token limit as its answer reports it (its rate-limit headers)."""


def reading_headers(
    reading: TokenReading | None, answered_ms: int, anthropic: bool
) -> dict[str, str]:
    """The rate-limit headers of an answer arriving at `answered_ms` in the provider's format
    (none without a reading, or once its reset has come)."""
    if reading is None or reading.reset_at_ms <= answered_ms:
        return {}
    reset_s = (reading.reset_at_ms - answered_ms) / 1000
    pairs = limit_headers(anthropic, {"tokens": reading.left}, reset_s, answered_ms / 1000,
                          reading.limit)  # fmt: skip
    return dict(pairs)


def raw_response(
    reply: Reply, elapsed_ms: int, *, answered_ms: int = 0, anthropic: bool = False
) -> ProviderResponse | None:
    """The raw facts a real adapter would return for `reply` (arriving at `answered_ms`, from a
    provider speaking Anthropic's format or OpenAI's), or None when the outcome can only be
    reported as an explicit kind (a handler's own verdict, e.g. a broken output contract)."""
    tin, tout = reply.input_tokens, reply.output_tokens
    limits = reading_headers(reply.reading, answered_ms, anthropic)
    if reply.kind is None:
        return ProviderResponse(ok=True, status=200, headers=limits, text=OK_TEXT,
                                stop_reason="stop", elapsed_ms=elapsed_ms, input_tokens=tin,
                                output_tokens=tout)
    sub = reply.subkind or ""
    if reply.kind is FailureKind.INVALID_OUTPUT:
        if sub in _STOPS:
            return ProviderResponse(ok=True, status=200, headers=limits, text=BAD_JSON,
                                    stop_reason=_STOPS[sub], elapsed_ms=elapsed_ms,
                                    input_tokens=tin, output_tokens=tout)
        if reply.reason in (None, "invalid_json") or sub == "invalid_response":
            return ProviderResponse(ok=True, status=200, headers=limits, text=BAD_JSON,
                                    stop_reason="stop", elapsed_ms=elapsed_ms, input_tokens=tin,
                                    output_tokens=tout)
        return None
    if sub in _EXCEPTIONS:
        return ProviderResponse(ok=False, status=None, exception=_EXCEPTIONS[sub]("simulated"),
                                elapsed_ms=elapsed_ms)
    if sub.endswith("_stop") and reply.kind is FailureKind.SAFETY:
        return ProviderResponse(ok=True, status=200, headers=limits, text=OK_TEXT,
                                stop_reason=sub[:-5], elapsed_ms=elapsed_ms, input_tokens=tin,
                                output_tokens=tout)
    status = reply.status
    body: bytes | None = None
    if status is None and sub.startswith("http_") and sub[5:].isdigit():
        status = int(sub[5:])
    if sub in KNOWN_ERROR_CODES or sub == "context_overflow":
        code = "context_length_exceeded" if sub == "context_overflow" else sub
        body = b'{"error": {"code": "%s"}}' % code.encode()
        if status is None:
            status = 529 if sub == "overloaded_error" else _STATUS_OF_KIND.get(reply.kind)
    if status is None:
        status = _STATUS_OF_KIND.get(reply.kind)
    if status is None:
        return None
    headers = dict(limits)
    if reply.retry_after_ms is not None:
        headers["retry-after"] = str(max(0, reply.retry_after_ms) // 1000)
    return ProviderResponse(ok=False, status=status, headers=headers, error_body=body,
                            elapsed_ms=elapsed_ms)


def call_result(
    job: Job, reply: Reply, clock: VirtualClock, *, anthropic: bool = False
) -> HandlerResult:
    """Advance virtual time by the call and give the real echo handler the raw facts (in
    Anthropic's format or OpenAI's: `anthropic`)."""
    left = max(0, job.deadline_ms - clock.now())
    if reply.latency_ms >= left:  # the adapter's deadline fires first: a timeout, like httpx's
        clock.advance(left)
        timeout = Reply(FailureKind.TRANSPORT, "timeout")
        return echo_handler(_answering(job, raw_response(timeout, left)))
    clock.advance(reply.latency_ms)
    response = raw_response(reply, reply.latency_ms, answered_ms=clock.now(), anthropic=anthropic)
    if response is None:
        assert reply.kind is not None
        return HandlerResult.failure(reply.kind, reply.reason)
    return echo_handler(_answering(job, response))


def _answering(job: Job, response: ProviderResponse | None) -> Job:
    """The job whose call gets `response`: `Job.call` hands it to the worker (`observe`) as it
    would a live answer."""
    assert response is not None
    return dataclasses.replace(job, caller=lambda _request: response)
