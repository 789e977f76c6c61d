"""The OpenTelemetry side of the tracing seam (R-OTEL-1), imported only by `configure` when an
OTLP endpoint is set and the `otel` extra is installed.

Spans: a SERVER span per gateway request (a child of an incoming W3C `traceparent`), an INTERNAL
span per worker queue item, and a CLIENT span per upstream attempt, a child of either, named
`{gen_ai.operation.name} {gen_ai.request.model}` and ended at the attempt's one settle with the
outcome's usage and the policy table's decision. Metrics: the operation's duration, its token
usage and (streams) the time to the first chunk. The tracer and meter providers are this
module's own (no global provider is set); the export is OTLP over HTTP/protobuf, to the endpoint
the standard variables name.

Invariant: the attribute values are ids, route keys, model ids, roles, kinds, subkinds, policy
action texts and counts; no body, header value, credential or error text is ever read here.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ledger.attempt import Attempt
from ledger.clock import monotonic_s
from ledger.kinds import AttemptRole
from ledger.records import Cancelled, Failed, Success
from ledger.telemetry import AttemptWatch, Traced
from ledger.telemetry import names as n
from ledger.telemetry.processor import BoundedBatchProcessor

OPERATION = "chat"
"""Every upstream call the ledger makes is a chat completion or a message (R-GW-1)."""
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)  # fmt: skip # the semconv's advice for the duration histograms
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)  # fmt: skip
DEFAULT_QUEUE = 2048
DEFAULT_BATCH = 512
DEFAULT_DELAY_MS = 5000
STOP_S = 1.0
"""The longest a stopping process waits to send the spans still queued, and then the metrics
(a collector that hangs delays a stop by at most twice this)."""

_PROPAGATOR = TraceContextTextMapPropagator()
_CURRENT: contextvars.ContextVar[_Request | None] = contextvars.ContextVar(
    "ledger_traced", default=None
)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        value = int(env.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def start(env: Mapping[str, str]) -> Tracing:
    """The process's tracing, configured by the standard OTEL_* variables."""
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "ledger"})
    base = (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").rstrip("/")
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or f"{base}/v1/traces"
    metrics = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or (base and f"{base}/v1/metrics")
    processor = BoundedBatchProcessor(
        OTLPSpanExporter(endpoint=traces),
        max_queue=_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE),
        batch=_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH),
        delay_s=_int(env, "OTEL_BSP_SCHEDULE_DELAY", DEFAULT_DELAY_MS) / 1000,
        stop_s=STOP_S,
    )
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(processor)
    meter_provider: MeterProvider | None = None
    if metrics:  # a traces-only endpoint sends no metrics
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=metrics))
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    return Tracing(tracer_provider, processor, meter_provider, n.names_for(env))


class _Request(Traced):
    """A request's or queue item's span; a streamed answer's ends at its attempt's settle."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.deferred = False
        self.ended = False

    def answered(self, status: int, streaming: bool = False) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_attribute(n.ERROR_TYPE, str(status))
            self.span.set_status(Status(StatusCode.ERROR))
        self.deferred = streaming

    def item_done(self, outcome: str, refusal: str | None, attempts: int) -> None:
        self.span.set_attribute(n.ITEM_OUTCOME, outcome)
        self.span.set_attribute(n.ATTEMPTS, attempts)
        if refusal is not None:
            self.refused(refusal)

    def refused(self, reason: str) -> None:
        self.span.set_attribute(n.REFUSAL, reason)

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.span.end()


class Tracing:
    """The process's tracer, meter and export queue."""

    def __init__(
        self,
        tracer_provider: TracerProvider,
        processor: BoundedBatchProcessor,
        meter_provider: MeterProvider | None,
        names: n.Names,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.processor = processor
        self.meter_provider = meter_provider
        self.names = names
        self.tracer = tracer_provider.get_tracer("ledger")
        self.duration: Histogram | None = None
        self.tokens: Histogram | None = None
        self.first_chunk: Histogram | None = None
        if meter_provider is not None:
            meter = meter_provider.get_meter("ledger")
            self.duration = meter.create_histogram(
                n.DURATION, unit="s", description="GenAI operation duration.",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )  # fmt: skip
            self.tokens = meter.create_histogram(
                n.TOKEN_USAGE, unit="{token}", description="Number of input and output tokens.",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            )  # fmt: skip
            self.first_chunk = meter.create_histogram(
                names.first_chunk_metric, unit="s",
                description="Time to the first chunk of a streamed answer.",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )  # fmt: skip

    @contextlib.contextmanager
    def _spanned(self, span: Span, parent: otel_context.Context | None) -> Iterator[Traced]:
        request = _Request(span)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        mine = _CURRENT.set(request)
        try:
            yield request
        except BaseException as exc:
            span.set_attribute(n.ERROR_TYPE, type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR))
            request.deferred = False
            raise
        finally:
            _CURRENT.reset(mine)
            otel_context.detach(token)
            if not request.deferred:
                request.end()

    def gateway_request(
        self, headers: Mapping[str, str], route: str
    ) -> contextlib.AbstractContextManager[Traced]:
        parent = _PROPAGATOR.extract(headers)  # reads `traceparent` (and `tracestate`) only
        span = self.tracer.start_span(
            f"POST {route}", context=parent, kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "http.route": route},
        )  # fmt: skip
        return self._spanned(span, parent)

    def queue_item(self, source: str) -> contextlib.AbstractContextManager[Traced]:
        span = self.tracer.start_span(
            "ledger queue item", kind=SpanKind.INTERNAL, attributes={n.SOURCE: source}
        )
        return self._spanned(span, None)

    def current(self) -> Traced | None:
        return _CURRENT.get()

    def watch(
        self, attempt: Attempt[Any], provider: str, model_id: str, max_tokens: int | None
    ) -> AttemptWatch:
        return _Attempt(self, attempt, provider, model_id, max_tokens, _CURRENT.get())

    def dropped(self) -> int:
        return self.processor.dropped

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown(timeout_millis=STOP_S * 1000)


class _Attempt(AttemptWatch):
    """One attempt's CLIENT span, from its reservation to its settle."""

    def __init__(
        self,
        tracing: Tracing,
        attempt: Attempt[Any],
        provider: str,
        model_id: str,
        max_tokens: int | None,
        request: _Request | None,
    ) -> None:
        self.tracing = tracing
        self.request = request
        self.started = monotonic_s()
        reservation = attempt.reservation
        self.metric_attributes: dict[str, Any] = {n.OPERATION: OPERATION, n.REQUEST_MODEL: model_id}
        for name in tracing.names.providers:
            self.metric_attributes[name] = provider
        attributes: dict[str, Any] = {
            **self.metric_attributes,
            n.RESERVATION: reservation.id,
            n.SOURCE: reservation.source,
            n.ROLE: reservation.role.value,
            n.NUMBER: attempt.number,
            n.ROUTE: attempt.route,
        }
        if max_tokens is not None:
            attributes[n.MAX_TOKENS] = max_tokens
        if reservation.pool is not None:
            attributes[n.POOL] = reservation.pool
        if request is not None:
            request.span.set_attribute(n.SOURCE, reservation.source)
        self.span = tracing.tracer.start_span(
            f"{OPERATION} {model_id}", kind=SpanKind.CLIENT, attributes=attributes
        )

    def replied(self, model: str) -> None:
        self.span.set_attribute(n.RESPONSE_MODEL, model)
        self.metric_attributes[n.RESPONSE_MODEL] = model

    def first_chunk(self, seconds: float) -> None:
        names = self.tracing.names
        if names.first_chunk_attribute is not None:
            self.span.set_attribute(names.first_chunk_attribute, seconds)
        if self.tracing.first_chunk is not None:
            self.tracing.first_chunk.record(seconds, self.metric_attributes)

    def settled(self, attempt: Attempt[Any]) -> None:
        span = self.span
        outcome, settled = attempt.outcome, attempt.settled
        if isinstance(outcome, Success | Failed | Cancelled):
            self._usage(outcome)
        if settled is not None:
            span.set_attribute(n.LATE, settled.late)
            span.set_attribute(n.POLICY_ACTIONS, list(settled.actions))
            span.set_attribute(n.PROBE, any("recovery probe" in a for a in settled.actions))
            if settled.kind is not None:
                span.set_attribute(n.POLICY_KIND, settled.kind)
                span.set_attribute(n.ERROR_TYPE, settled.kind)
                self.metric_attributes[n.ERROR_TYPE] = settled.kind
                span.set_status(Status(StatusCode.ERROR))
            if settled.subkind is not None:
                span.set_attribute(n.POLICY_SUBKIND, settled.subkind)
            if settled.reason is not None:  # a broken rule's code (a fixed set), never text
                span.set_attribute(n.POLICY_REASON, settled.reason)
            follow_up = _next(settled.use_correction, settled.retry_after_ms, settled.fallback)
            span.set_attribute(n.POLICY_NEXT, follow_up)
        if self.tracing.duration is not None:
            self.tracing.duration.record(monotonic_s() - self.started, self.metric_attributes)
        span.end()
        request = self.request
        if request is not None and request.deferred:  # the stream's end ends its request
            request.end()

    def _usage(self, outcome: Success | Failed | Cancelled) -> None:
        names = self.tracing.names
        counts = [
            (n.INPUT_TOKENS, outcome.input_tokens, "input"),
            (n.OUTPUT_TOKENS, outcome.output_tokens, "output"),
            (n.CACHE_READ, outcome.cache_read_tokens, None),
            (names.cache_creation, outcome.cache_write_tokens, None),
        ]
        for name, value, token_type in counts:
            if name is None or value is None:
                continue
            self.span.set_attribute(name, value)
            if token_type is not None and self.tracing.tokens is not None:
                attributes = {**self.metric_attributes, n.TOKEN_TYPE: token_type}
                self.tracing.tokens.record(value, attributes)


def _next(correction: bool, retry_after_ms: int | None, fallback: str | None) -> str:
    """The follow-up the settle permitted: correction, retry, fallback or none."""
    if correction:
        return AttemptRole.CORRECTION.value
    if retry_after_ms is not None:
        return AttemptRole.RETRY.value
    return AttemptRole.FALLBACK.value if fallback is not None else "none"
