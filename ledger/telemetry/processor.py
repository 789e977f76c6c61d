"""A batch span processor with a bounded queue that counts what it drops (R-OTEL-1).

`on_end` (the request's own task) only appends to a bounded deque under a lock: it never waits on
the network. One daemon thread sends the queue in batches every `delay_s` (or as soon as a batch
is full); a collector that is slow or down blocks only that thread, the queue fills, and every
span that finds it full is dropped and counted (`dropped`), as are those still queued when the
process stops and the final flush runs out of time, and the batch then still in flight. The SDK's
own BatchSpanProcessor behaves the same but keeps its drop count inside its private state; this
one shows it (`ledger serve`'s `/metrics`, the worker's last line).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter


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
        if full:
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
