"""The OpenTelemetry side of the tracing seam (R-OTEL-1), imported only by `configure` when an
OTLP endpoint is set and the `otel` extra is installed.

Spans: a SERVER span per gateway request (a child of an incoming W3C `traceparent`), an INTERNAL
span per worker queue item, and a CLIENT span per upstream attempt, a child of either, named
`{gen_ai.operation.name} {gen_ai.request.model}` with the outcome's usage and the policy table's
decision. Metrics: the operation's duration, its token usage and (streams) the time to the first
chunk. The tracer and meter providers are this module's own (no global provider is set); the
export is OTLP over HTTP/protobuf, to the endpoint the standard variables name.

Cost on the request path (the bench's `otel` figure): a span is made finished, once, when it ends
(`_Spans`): its id and the sampler's decision when it starts (the provider's own id generator and
sampler, so `OTEL_TRACES_SAMPLER` and an incoming sampled flag still decide), then one
`ReadableSpan` with its start and end times and every attribute, handed to the batch processor.
No live SDK span (its lock, its attribute cleaning per `set_attribute`, its copy at the end) and
no OpenTelemetry context is kept while a request runs: nothing else in the process reads them.
The histogram records go through a bounded queue to a thread of their own (`MetricQueue`): the
SDK's work per record (attribute cleaning and hashing, exemplar, aggregation lock) is done there,
never while the caller waits; what the request path builds per attempt is one attribute dict.

Invariant: the attribute values are ids, route keys, model ids, roles, kinds, subkinds, policy
action texts and counts (str, int, float, bool or a tuple of str: what the SDK's cleaning would
keep as they are); no body, header value, credential or error text is ever read here.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Mapping
from time import time_ns
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ledger.attempt import Attempt
from ledger.clock import monotonic_s
from ledger.kinds import AttemptRole
from ledger.records import Cancelled, Failed, Success
from ledger.telemetry import AttemptWatch, Traced
from ledger.telemetry import names as n
from ledger.telemetry.processor import BoundedBatchProcessor, MetricQueue

OPERATION = "chat"
"""Every upstream call the ledger makes is a chat completion or a message (R-GW-1)."""
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)  # fmt: skip # the semconv's advice for the duration histograms
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)  # fmt: skip
DEFAULT_QUEUE = 2048
DEFAULT_BATCH = 512
DEFAULT_DELAY_MS = 5000
METRIC_DELAY_S = 0.05
"""How long the metric thread lets records gather before it takes them (a small bite each time,
never the moment a request queues one)."""
METRIC_QUEUE = 8192
"""Histogram records queued at most (three an attempt): only a thread starved of CPU for
seconds fills it."""
STOP_S = 1.0
"""The longest a stopping process waits to send the spans still queued, and then the metrics
(a collector that hangs delays a stop by at most twice this)."""
MAX_METRIC_SETS = 256
"""Metric attribute sets kept per model (one per response model and error kind seen)."""
TRACEPARENT = "traceparent"
ERROR = Status(StatusCode.ERROR)
UNSET = Status(StatusCode.UNSET)
SAMPLE = Decision.RECORD_AND_SAMPLE  # the sampler's `is_sampled()`
SCOPE = InstrumentationScope("ledger")

_PROPAGATOR = TraceContextTextMapPropagator()
_ROOT = otel_context.Context()  # a request without `traceparent` starts its own trace
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
    max_queue = _int(env, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE)
    processor = BoundedBatchProcessor(
        OTLPSpanExporter(endpoint=traces),
        max_queue=max_queue,
        batch=_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH),
        delay_s=_int(env, "OTEL_BSP_SCHEDULE_DELAY", DEFAULT_DELAY_MS) / 1000,
        stop_s=STOP_S,
    )
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(processor)  # its shutdown stops the processor
    meter_provider: MeterProvider | None = None
    if metrics:  # a traces-only endpoint sends no metrics
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=metrics))
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    return Tracing(tracer_provider, processor, meter_provider, n.names_for(env))


class _Spans:
    """Spans made finished: a context when one starts, one `ReadableSpan` when it ends."""

    def __init__(self, provider: TracerProvider, processor: BoundedBatchProcessor) -> None:
        self.sampler = provider.sampler
        self.ids = provider.id_generator
        self.resource = provider.resource
        self.processor = processor
        self.random_ids = self.ids.is_trace_id_random()
        limits = SpanLimits()  # OTEL_SPAN_ATTRIBUTE_*_LIMIT, as the SDK's own spans read them
        self.max_attributes = limits.max_span_attributes
        self.max_length = limits.max_span_attribute_length

    def open(
        self,
        parent_context: otel_context.Context,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, Any],
    ) -> tuple[SpanContext, SpanContext | None, Mapping[str, Any]]:
        """A new span's context in its parent's trace (or a new one) with the sampler's decision;
        the parent's context (None: a root) and the attributes as the sampler returns them."""
        parent: SpanContext | None = trace.get_current_span(parent_context).get_span_context()
        if parent is not None and parent.is_valid:
            trace_id = parent.trace_id
            random_id = parent.trace_flags.random_trace_id
        else:
            parent = None
            trace_id = self.ids.generate_trace_id()
            random_id = self.random_ids
        sampled = self.sampler.should_sample(parent_context, trace_id, name, kind, attributes)
        flags = TraceFlags.SAMPLED if sampled.decision is SAMPLE else TraceFlags.DEFAULT
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        context = SpanContext(
            trace_id, self.ids.generate_span_id(), is_remote=False,
            trace_flags=TraceFlags(flags), trace_state=sampled.trace_state,
        )  # fmt: skip
        return context, parent, sampled.attributes

    def finish(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: Mapping[str, Any],
        error: bool,
        start_ns: int,
    ) -> None:
        """The ended span to the export queue (a span the sampler dropped: nowhere)."""
        if not context.trace_flags.sampled:
            return
        if self.max_length is not None or (
            self.max_attributes is not None and len(attributes) > self.max_attributes
        ):  # limits an operator set: the SDK's own cleaning applies them
            attributes = BoundedAttributes(
                self.max_attributes, attributes, immutable=True, max_value_len=self.max_length
            )
        span = ReadableSpan(
            name, context, parent, self.resource, attributes, kind=kind,
            status=ERROR if error else UNSET, start_time=start_ns, end_time=time_ns(),
            instrumentation_scope=SCOPE,
        )  # fmt: skip
        self.processor.on_end(span)


class _Request(Traced):
    """A request's or queue item's span: its context (its attempts' parent) when it starts, the
    attributes it gains while it runs, and the finished span when it ends; a streamed answer's
    ends at its attempt's settle."""

    __slots__ = ("attributes", "deferred", "ended", "error", "kind", "name", "parent",
                 "parent_context", "span_context", "spans", "start_ns", "var")  # fmt: skip

    def __init__(
        self,
        spans: _Spans,
        name: str,
        kind: SpanKind,
        parent_context: otel_context.Context,
        attributes: Mapping[str, Any],
    ) -> None:
        self.start_ns = time_ns()
        self.spans = spans
        self.name = name
        self.kind = kind
        self.span_context, self.parent, sampled = spans.open(parent_context, name, kind, attributes)
        self.attributes: dict[str, Any] = dict(sampled)
        self.parent_context: otel_context.Context | None = None
        self.error = False
        self.deferred = False
        self.ended = False

    @property
    def context(self) -> otel_context.Context:
        """The OpenTelemetry context that has this span current (its attempts' parent)."""
        if self.parent_context is None:  # made once, by the first attempt that asks
            self.parent_context = trace.set_span_in_context(NonRecordingSpan(self.span_context))
        return self.parent_context

    def __enter__(self) -> _Request:
        self.var = _CURRENT.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> None:
        if kind is not None:
            self.attributes[n.ERROR_TYPE] = kind.__qualname__
            self.error = True
            self.deferred = False
        _CURRENT.reset(self.var)
        if not self.deferred:
            self.end()

    def answered(self, status: int, streaming: bool = False) -> None:
        self.attributes["http.response.status_code"] = status
        if status >= 500:
            self.attributes[n.ERROR_TYPE] = str(status)
            self.error = True
        self.deferred = streaming

    def item_done(self, outcome: str, refusal: str | None, attempts: int) -> None:
        self.attributes[n.ITEM_OUTCOME] = outcome
        self.attributes[n.ATTEMPTS] = attempts
        if refusal is not None:
            self.refused(refusal)

    def refused(self, reason: str) -> None:
        self.attributes[n.REFUSAL] = reason

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            attributes, self.attributes = self.attributes, {}  # the span's own from now on
            self.spans.finish(
                self.name, self.span_context, self.parent, self.kind, attributes, self.error,
                self.start_ns,
            )  # fmt: skip


class _Model:
    """What every attempt on one (provider, model) shares, built once: its span name, its
    span's model attributes and its metric attribute sets (by response model and error kind)."""

    __slots__ = ("attributes", "metric_sets", "name")

    def __init__(self, provider: str, model_id: str, names: n.Names) -> None:
        self.name = f"{OPERATION} {model_id}"
        self.attributes: dict[str, Any] = {n.OPERATION: OPERATION, n.REQUEST_MODEL: model_id}
        for name in names.providers:
            self.attributes[name] = provider
        self.metric_sets: dict[tuple[str | None, str | None], _MetricSets] = {}

    def metrics(self, response_model: str | None, error: str | None) -> _MetricSets:
        """The metric attributes of an attempt that `response_model` answered (None: none
        named) and that failed with `error` (None: it did not)."""
        key = (response_model, error)
        found = self.metric_sets.get(key)
        if found is None:
            if len(self.metric_sets) >= MAX_METRIC_SETS:  # a provider naming endless models
                self.metric_sets.clear()
            found = self.metric_sets[key] = _MetricSets(self.attributes, response_model, error)
        return found


class _MetricSets:
    """The attribute dicts of one attempt's histogram records (never changed once built: the
    queued records share them)."""

    __slots__ = ("input", "operation", "output")

    def __init__(
        self, base: Mapping[str, Any], response_model: str | None, error: str | None
    ) -> None:
        operation = dict(base)
        if response_model is not None:
            operation[n.RESPONSE_MODEL] = response_model
        if error is not None:
            operation[n.ERROR_TYPE] = error
        self.operation = operation
        self.input = {**operation, n.TOKEN_TYPE: "input"}
        self.output = {**operation, n.TOKEN_TYPE: "output"}


class Tracing:
    """The process's spans, histograms and export queues."""

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
        self.spans = _Spans(tracer_provider, processor)
        self.models: dict[tuple[str, str], _Model] = {}
        self.routes: dict[str, tuple[str, dict[str, Any]]] = {}
        self.duration: Histogram | None = None
        self.tokens: Histogram | None = None
        self.first_chunk: Histogram | None = None
        self.metrics: MetricQueue | None = None
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
            self.metrics = MetricQueue(METRIC_QUEUE, METRIC_DELAY_S)

    def gateway_request(
        self, headers: Mapping[str, str], route: str
    ) -> contextlib.AbstractContextManager[Traced]:
        # only a request that names a caller's span pays for the W3C parse
        parent = _PROPAGATOR.extract(headers) if TRACEPARENT in headers else _ROOT
        found = self.routes.get(route)
        if found is None:
            found = self.routes[route] = (
                f"POST {route}",
                {"http.request.method": "POST", "http.route": route},
            )
        name, attributes = found
        return _Request(self.spans, name, SpanKind.SERVER, parent, attributes)

    def queue_item(self, source: str) -> contextlib.AbstractContextManager[Traced]:
        return _Request(
            self.spans, "ledger queue item", SpanKind.INTERNAL, otel_context.get_current(),
            {n.SOURCE: source},
        )  # fmt: skip

    def current(self) -> Traced | None:
        return _CURRENT.get()

    def model(self, provider: str, model_id: str) -> _Model:
        """The shared attributes of the attempts on `model_id` of `provider`."""
        key = (provider, model_id)
        found = self.models.get(key)
        if found is None:
            found = self.models[key] = _Model(provider, model_id, self.names)
        return found

    def watch(
        self, attempt: Attempt[Any], provider: str, model_id: str, max_tokens: int | None
    ) -> AttemptWatch:
        return _Attempt(self, attempt, self.model(provider, model_id), max_tokens, _CURRENT.get())

    def dropped(self) -> int:
        return self.processor.dropped

    def shutdown(self) -> None:
        if self.metrics is not None:
            self.metrics.shutdown(STOP_S)  # the queued records into the SDK before its last export
        self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown(timeout_millis=STOP_S * 1000)


class _Attempt(AttemptWatch):
    """One attempt's CLIENT span: what is known when the attempt starts (its start time, its
    parent, its reservation's facts) is kept, and the finished span made at its one settle."""

    __slots__ = ("attributes", "model", "parent_context", "request", "response_model",
                 "start_ns", "started", "tracing")  # fmt: skip

    def __init__(
        self,
        tracing: Tracing,
        attempt: Attempt[Any],
        model: _Model,
        max_tokens: int | None,
        request: _Request | None,
    ) -> None:
        self.start_ns = time_ns()
        self.started = monotonic_s()
        self.tracing = tracing
        self.model = model
        self.request = request
        # the request's or item's span; without one, whatever the caller has current
        self.parent_context = request.context if request is not None else otel_context.get_current()
        self.response_model: str | None = None
        reservation = attempt.reservation
        attributes = dict(model.attributes)
        attributes[n.RESERVATION] = reservation.id
        attributes[n.SOURCE] = reservation.source
        attributes[n.ROLE] = reservation.role.value
        attributes[n.NUMBER] = attempt.number
        attributes[n.ROUTE] = attempt.route
        if max_tokens is not None:
            attributes[n.MAX_TOKENS] = max_tokens
        if reservation.pool is not None:
            attributes[n.POOL] = reservation.pool
        self.attributes = attributes
        if request is not None:
            request.attributes[n.SOURCE] = reservation.source

    def replied(self, model: str) -> None:
        self.response_model = model

    def first_chunk(self, seconds: float) -> None:
        tracing = self.tracing
        if tracing.names.first_chunk_attribute is not None:
            self.attributes[tracing.names.first_chunk_attribute] = seconds
        if tracing.first_chunk is not None and tracing.metrics is not None:
            metrics = self.model.metrics(self.response_model, None)
            request = self.request.span_context if self.request is not None else None
            tracing.metrics.record(tracing.first_chunk, seconds, metrics.operation, request)

    def settled(self, attempt: Attempt[Any]) -> None:
        elapsed = monotonic_s() - self.started
        tracing = self.tracing
        attributes = self.attributes
        if self.response_model is not None:
            attributes[n.RESPONSE_MODEL] = self.response_model
        outcome, settled = attempt.outcome, attempt.settled
        usage = outcome if isinstance(outcome, Success | Failed | Cancelled) else None
        if usage is not None:
            _usage(attributes, usage, tracing.names.cache_creation)
        error: str | None = None
        if settled is not None:
            attributes[n.LATE] = settled.late
            attributes[n.POLICY_ACTIONS] = settled.actions
            attributes[n.PROBE] = any("recovery probe" in a for a in settled.actions)
            error = settled.kind
            if error is not None:
                attributes[n.POLICY_KIND] = error
                attributes[n.ERROR_TYPE] = error
            if settled.subkind is not None:
                attributes[n.POLICY_SUBKIND] = settled.subkind
            if settled.reason is not None:  # a broken rule's code (a fixed set), never text
                attributes[n.POLICY_REASON] = settled.reason
            follow_up = _next(settled.use_correction, settled.retry_after_ms, settled.fallback)
            attributes[n.POLICY_NEXT] = follow_up
        name = self.model.name
        spans = tracing.spans
        context, parent, sampled = spans.open(
            self.parent_context, name, SpanKind.CLIENT, attributes
        )
        spans.finish(
            name, context, parent, SpanKind.CLIENT, sampled, error is not None, self.start_ns
        )
        self.attributes = {}  # the span's own from now on
        metrics = tracing.metrics
        if metrics is not None and tracing.duration is not None and tracing.tokens is not None:
            found = self.model.metrics(self.response_model, error)
            metrics.record(tracing.duration, elapsed, found.operation, context)
            if usage is not None:
                if usage.input_tokens is not None:
                    metrics.record(tracing.tokens, usage.input_tokens, found.input, context)
                if usage.output_tokens is not None:
                    metrics.record(tracing.tokens, usage.output_tokens, found.output, context)
        request = self.request
        if request is not None and request.deferred:  # the stream's end ends its request
            request.end()


def _usage(
    attributes: dict[str, Any], outcome: Success | Failed | Cancelled, cache_creation: str | None
) -> None:
    """The token counts the outcome reports, as span attributes."""
    if outcome.input_tokens is not None:
        attributes[n.INPUT_TOKENS] = outcome.input_tokens
    if outcome.output_tokens is not None:
        attributes[n.OUTPUT_TOKENS] = outcome.output_tokens
    if outcome.cache_read_tokens is not None:
        attributes[n.CACHE_READ] = outcome.cache_read_tokens
    if cache_creation is not None and outcome.cache_write_tokens is not None:
        attributes[cache_creation] = outcome.cache_write_tokens


def _next(correction: bool, retry_after_ms: int | None, fallback: str | None) -> str:
    """The follow-up the settle permitted: correction, retry, fallback or none."""
    if correction:
        return AttemptRole.CORRECTION.value
    if retry_after_ms is not None:
        return AttemptRole.RETRY.value
    return AttemptRole.FALLBACK.value if fallback is not None else "none"
