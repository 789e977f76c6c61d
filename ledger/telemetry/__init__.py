"""The tracing seam (R-OTEL-1): what `ledger serve` and `ledger worker run` call around a gateway
request, a queue item and each upstream attempt. Without the `otel` extra, or without
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, every call here is a no-op
and no `opentelemetry` module is imported; with both, `configure` loads `ledger.telemetry.otel`
(the SDK, the OTLP/HTTP exporter) once, at the process's start.

Invariant: nothing here reads or keeps a prompt, a reply, a header value (but an incoming
`traceparent`), a credential or a provider's error body; the attributes are the ledger's own
facts (ids, roles, kinds, token counts). Export never blocks a caller: spans go to a bounded
queue that a background thread sends in batches (processor.py); a full queue drops the span and
counts it (`dropped`). The in-process library never calls `configure`: its caller owns the spans.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from ledger.attempt import Attempt

__all__ = [
    "ENDPOINT_VARIABLES",
    "MISSING_EXTRA",
    "NOOP",
    "AttemptWatch",
    "Traced",
    "configure",
    "dropped",
    "enabled",
    "first_chunk",
    "gateway_request",
    "max_tokens",
    "queue_item",
    "refused",
    "replied",
    "shutdown",
    "watch",
]

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
MISSING_EXTRA = (
    "telemetry: OTEL_EXPORTER_OTLP_ENDPOINT is set but the otel extra is not installed"
    " (python -m pip install 'llm-budget-ledger[otel]'); no traces are sent"
)


class Traced:
    """A gateway request's or queue item's span (this base: the no-op one)."""

    def answered(self, status: int, streaming: bool = False) -> None:
        """The request's HTTP status; `streaming`: its span ends when the stream's attempt
        settles, not now."""

    def item_done(self, outcome: str, refusal: str | None, attempts: int) -> None:
        """How the queue item ended."""

    def refused(self, reason: str) -> None:
        """A refusal's reason code (a reserve refused before any call)."""


class AttemptWatch:
    """One attempt's span (this base: the no-op one); `Attempt.record` calls `settled`."""

    def replied(self, model: str) -> None:
        """The model the provider says answered (`gen_ai.response.model`)."""

    def first_chunk(self, seconds: float) -> None:
        """A streamed answer's first content event came `seconds` after the request."""

    def settled(self, attempt: Attempt[Any]) -> None:
        """The attempt's one settle: its outcome and the policy's decision are known."""


NOOP = Traced()


class Tracing(Protocol):
    """What `ledger.telemetry.otel` starts: the spans, the metrics and the export."""

    def gateway_request(
        self, headers: Mapping[str, str], route: str
    ) -> contextlib.AbstractContextManager[Traced]: ...

    def queue_item(self, source: str) -> contextlib.AbstractContextManager[Traced]: ...

    def watch(
        self, attempt: Attempt[Any], provider: str, model_id: str, max_tokens: int | None
    ) -> AttemptWatch: ...

    def current(self) -> Traced | None: ...

    def dropped(self) -> int: ...

    def shutdown(self) -> None: ...


_active: list[Tracing] = []  # at most one: the process's tracing, once configured


def enabled() -> bool:
    """Whether this process exports traces."""
    return bool(_active)


def configure(env: Mapping[str, str], warn: Callable[[str], None]) -> bool:
    """Start tracing when an OTLP endpoint variable is set and the extra is installed (else
    nothing is imported; a set variable without the extra is one line through `warn`)."""
    if _active:
        return True
    if not any(env.get(name) for name in ENDPOINT_VARIABLES):
        return False
    try:
        from ledger.telemetry import otel  # lazy: the SDK only when an endpoint is configured
    except ImportError:
        warn(MISSING_EXTRA)
        return False
    _active.append(otel.start(env))
    return True


def shutdown() -> int:
    """Flush what the queue holds (bounded) and stop; returns the spans dropped in all."""
    if not _active:
        return 0
    tracing = _active.pop()
    tracing.shutdown()
    return tracing.dropped()


def dropped() -> int:
    """Spans dropped so far because the export queue was full (0 without tracing)."""
    return _active[0].dropped() if _active else 0


def gateway_request(
    headers: Mapping[str, str], route: str
) -> contextlib.AbstractContextManager[Traced]:
    """The span of one gateway request, a child of the caller's W3C `traceparent` if any."""
    if not _active:
        return contextlib.nullcontext(NOOP)
    return _active[0].gateway_request(headers, route)


def queue_item(source: str) -> contextlib.AbstractContextManager[Traced]:
    """The span of one worker queue item."""
    if not _active:
        return contextlib.nullcontext(NOOP)
    return _active[0].queue_item(source)


def watch(
    attempt: Attempt[Any], provider: str, model_id: str, max_tokens: int | None = None
) -> None:
    """Open the attempt's CLIENT span (a child of the current request or item); it ends at the
    attempt's one settle (`Attempt.record`)."""
    if _active:
        attempt.observer = _active[0].watch(attempt, provider, model_id, max_tokens)


def replied(attempt: Attempt[Any], document: Mapping[str, Any] | None) -> None:
    """The answering model as the provider's reply document names it."""
    observer = attempt.observer
    if isinstance(observer, AttemptWatch) and document is not None:
        model = document.get("model")
        if isinstance(model, str):
            observer.replied(model)


def first_chunk(attempt: Attempt[Any], seconds: float, events: Iterable[Any] = ()) -> None:
    """A streamed attempt's time to its first content event; the model the stream's first
    events name (OpenAI's chunks: `model`; Anthropic's `message_start`: `message.model`)."""
    observer = attempt.observer
    if not isinstance(observer, AttemptWatch):
        return
    observer.first_chunk(seconds)
    for data in events:
        if isinstance(data, Mapping):
            inner = data.get("message")
            found = data.get("model")
            if found is None and isinstance(inner, Mapping):
                found = inner.get("model")
            if isinstance(found, str):
                observer.replied(found)
                return


def refused(reason: str) -> None:
    """A refusal's reason code on the current request's or item's span."""
    if _active:
        current = _active[0].current()
        if current is not None:
            current.refused(reason)


@contextlib.contextmanager
def session(env: Mapping[str, str], warn: Callable[[str], None]) -> Iterator[bool]:
    """`configure` for the length of a command; at its end the queue is flushed and a count of
    dropped spans, if any, is one line through `warn`."""
    started = configure(env, warn)
    try:
        yield started
    finally:
        if started:
            lost = shutdown()
            if lost:
                warn(f"telemetry: {lost} span(s) dropped (the collector was slow or down)")


MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def max_tokens(body: Mapping[str, Any]) -> int | None:
    """The reply limit an upstream body sends (`gen_ai.request.max_tokens`), whatever its
    format calls it."""
    for name in MAX_TOKENS_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
