"""The queues between the request path and the export (R-OTEL-1): a batch span processor with a
bounded queue that counts what it drops, and the bounded queue of histogram records.

`on_end` (the request's own task) only appends to a bounded deque under a lock: it never waits on
the network. One daemon thread sends the queue in batches every `delay_s` (or as soon as a batch
is full); a collector that is slow or down blocks only that thread, the queue fills, and every
span that finds it full is dropped and counted (`dropped`), as are those still queued when the
process stops and the final flush runs out of time, and the batch then still in flight. The SDK's
own BatchSpanProcessor behaves the same but keeps its drop count inside its private state; this
one shows it (`ledger serve`'s `/metrics`, the worker's last line).

`MetricQueue.record` appends a histogram record to a bounded deque (no lock: one append, one
length check); its own thread, woken by the first record and then waiting `delay_s` for more,
hands them to the SDK, so the SDK's work per record (cleaning and hashing the attributes, the
exemplar, the aggregation's lock) is never the request's; an idle process's thread sleeps. A
full queue drops the record and counts it; a stop records what is left.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import Histogram
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext


class BoundedBatchProcessor(SpanProcessor):
    """Spans to `exporter` in batches of at most `batch` from a queue of at most `max_queue`."""

    def __init__(
        self, exporter: SpanExporter, max_queue: int, batch: int, delay_s: float, stop_s: float
    ) -> None:
        self._exporter = exporter
        self._max = max(1, max_queue)
        self._batch = max(1, min(batch, self._max))
        self._delay_s = delay_s
        self._stop_s = stop_s
        self._queue: deque[ReadableSpan] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._sending = False
        self._in_flight = 0  # spans of the batch being exported now
        self._stopping = False
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="ledger-otel-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do when a span starts."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the ended span, or drop and count it when the queue is full."""
        if not span.context.trace_flags.sampled:
            return
        with self._lock:
            if self._stopping or len(self._queue) >= self._max:
                self.dropped += 1
                return
            self._queue.append(span)
            full = len(self._queue) >= self._batch
        if full and not self._wake.is_set():  # one wake a batch, not one a span
            self._wake.set()

    def _take(self) -> Sequence[ReadableSpan]:
        with self._lock:
            count = min(self._batch, len(self._queue))
            taken = [self._queue.popleft() for _ in range(count)]
            self._sending = bool(taken)
            self._in_flight = len(taken)
            if not taken:
                self._idle.notify_all()
            return taken

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            while batch := self._take():
                try:
                    self._exporter.export(batch)
                except Exception:  # noqa: S112 - an exporter fault loses the batch, never the process
                    continue
            if self._stopping:
                return

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait (at most the timeout) until the queue is sent."""
        self._wake.set()
        with self._lock:
            return self._idle.wait_for(
                lambda: not self._queue and not self._sending, timeout_millis / 1000
            )

    def shutdown(self) -> None:
        """Send what is queued within `stop_s`, then stop; the rest counts as dropped."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        self._thread.join(self._stop_s)
        with self._lock:
            self.dropped += len(self._queue)
            self._queue.clear()
            if self._thread.is_alive():  # still waiting on the collector: that batch is lost
                self.dropped += self._in_flight
        self._exporter.shutdown()


class MetricQueue:
    """Histogram records, queued by the request path and made by a thread of their own."""

    def __init__(self, max_queue: int, delay_s: float) -> None:
        self._max = max(1, max_queue)
        self._delay_s = delay_s
        self._queue: deque[tuple[Histogram, float, Mapping[str, Any], SpanContext | None]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="ledger-otel-metrics", daemon=True)
        self._thread.start()

    def record(
        self,
        histogram: Histogram,
        value: float,
        attributes: Mapping[str, Any],
        span: SpanContext | None,
    ) -> None:
        """Queue one record (`span`: the span it belongs to, for the SDK's exemplars); a full
        queue drops it and counts it. `attributes` must not change afterwards."""
        queue = self._queue
        if len(queue) >= self._max:
            self.dropped += 1
            return
        queue.append((histogram, value, attributes, span))
        if not self._wake.is_set():  # the first record since the last drain
            self._wake.set()

    def _drain(self) -> None:
        queue = self._queue
        while True:
            try:
                histogram, value, attributes, span = queue.popleft()
            except IndexError:
                return
            context = None if span is None else trace.set_span_in_context(NonRecordingSpan(span))
            histogram.record(value, attributes, context)

    def _run(self) -> None:
        while not self._stopping:  # checked after each drain: `shutdown`'s wake may be cleared
            self._wake.wait()
            if self._stopping:
                return
            # let the records gather, and the request that queued the first one end
            time.sleep(self._delay_s)
            self._wake.clear()
            self._drain()

    def shutdown(self, timeout_s: float) -> None:
        """Stop the thread (waiting at most `timeout_s`) and record what is still queued, in
        the caller's thread."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        self._drain()
