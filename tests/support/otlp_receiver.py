"""A real OTLP/HTTP receiver for the tracing tests (R-OTEL-1): a small HTTP server on 127.0.0.1
that decodes each `POST /v1/traces` and `/v1/metrics` body with the official protobuf messages
(opentelemetry-proto) and keeps the raw bytes too, so a test can search everything exported.
`silent=True`: it reads each request and never answers (a collector that hangs)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def value_of(value: AnyValue) -> Any:
    """A decoded attribute value as Python."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    return None if kind is None else getattr(value, kind)


@dataclass
class Received:
    """One exported span: its name, kind, ids, status and attributes."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    status: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]


class Receiver:
    """The receiver's state: every raw body and decoded span and metric name, by arrival."""

    def __init__(self, silent: bool = False) -> None:
        self.silent = silent
        self.raw: list[bytes] = []
        self.spans: list[Received] = []
        self.metrics: dict[str, list[dict[str, Any]]] = {}
        self.requests = 0
        self._changed = threading.Condition()
        self._closing = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver.took(self.path, body)
                if receiver.silent:  # hang until the test ends
                    receiver._closing.wait()
                    return
                answer = (
                    ExportTraceServiceResponse() if self.path == "/v1/traces"
                    else ExportMetricsServiceResponse()
                ).SerializeToString()  # fmt: skip
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def took(self, path: str, body: bytes) -> None:
        with self._changed:
            self.requests += 1
            self.raw.append(body)
            if path == "/v1/traces":
                self.spans += list(_spans(body))
            elif path == "/v1/metrics":
                for name, points in _metrics(body):
                    self.metrics.setdefault(name, []).extend(points)
            self._changed.notify_all()

    def wait_for(self, ready: Callable[[Receiver], bool], timeout_s: float = 30.0) -> None:
        """Wait until `ready(self)` holds (checked on every arrival); fail after the timeout."""
        end = time.monotonic() + timeout_s
        with self._changed:
            while not ready(self):
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the receiver did not get it: {len(self.spans)} spans")
                self._changed.wait(left)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def _spans(body: bytes) -> Iterator[Received]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                yield _received(span)


def _received(span: Span) -> Received:
    return Received(
        span.name, span.kind, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
        span.status.code, span.start_time_unix_nano, span.end_time_unix_nano,
        {a.key: value_of(a.value) for a in span.attributes},
    )  # fmt: skip


def _metrics(body: bytes) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points = metric.histogram.data_points if metric.HasField("histogram") else []
                yield metric.name, [
                    {"count": p.count, "sum": p.sum,
                     **{a.key: value_of(a.value) for a in p.attributes}}
                    for p in points
                ]  # fmt: skip
