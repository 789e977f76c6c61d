"""`/v1/status`, `/metrics`, `/healthz`, `/readyz`: the status document and the service's health.

`/metrics` is the status gauges (the same renderer as `ledger status --prometheus`) followed by
the service's own request counts and latency histograms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from ledger import telemetry
from ledger.errors import StoreError
from ledger.service.answers import HealthzOut, ReadyOut
from ledger.service.calls import LedgerDep
from ledger.service.errors import error_response
from ledger.service.openapi import GATE, errors
from ledger.service.status_schema import StatusOut
from ledger.status.document import build_status, render_prometheus
from ledger.store.migrate import HEAD_REVISION, current_revision

router = APIRouter(tags=["operations"])
EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"
disable_created_metrics()  # type: ignore[no-untyped-call] # no `_created` series: this process serves only this registry
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"


class RequestMetrics:
    """Request counts and latencies by method, route template (never the raw path) and status;
    the size of every group-commit batch. Every label comes from a fixed set (R-SRV-9): a method
    outside `KNOWN_METHODS` is `other`; the caller passes a route template or a fixed word."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "ledger_http_requests",
            "HTTP requests answered, by method, route and status.",
            ("method", "route", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "ledger_http_request_duration_seconds",
            "Time from the request's arrival to its answer.",
            ("method", "route"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch = Histogram(
            "ledger_commit_batch_size",
            "Reserves and settles written per transaction (group commit).",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.waiting = Gauge(
            "ledger_commit_waiting",
            "Reserves and settles waiting for the write transaction in progress to end.",
            registry=self.registry,
        )
        self.in_progress = Gauge(
            "ledger_commit_in_progress",
            "Reserves and settles in the write transaction in progress (0: none).",
            registry=self.registry,
        )
        Gauge(  # R-OTEL-1: export never waits; a span that finds the queue full is counted
            "ledger_otel_spans_dropped",
            "Trace spans dropped because the export queue was full (0: none, or no tracing).",
            registry=self.registry,
        ).set_function(telemetry.dropped)

    def watch_connections(self, count: Callable[[str], int], pools: Iterable[str]) -> None:
        """Export each connection pool's live count (`ledger_http_connections{pool}`, R-SRV-9)."""
        gauge = Gauge(
            "ledger_http_connections",
            "Live HTTP connections, by pool (unix, tcp, unauthenticated, overflow).",
            ("pool",),
            registry=self.registry,
        )
        for pool in pools:
            gauge.labels(pool).set_function(partial(count, pool))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one answered request."""
        method = method if method in KNOWN_METHODS else OTHER_METHOD
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def exposition(self) -> str:
        """The text exposition of the request metrics."""
        return generate_latest(self.registry).decode()


@router.get(
    "/v1/status", operation_id="status", response_model=StatusOut, responses=errors(*GATE)
)
def status(ledger: LedgerDep) -> JSONResponse:
    """The whole status document (`ledger status --json`)."""
    return JSONResponse(build_status(ledger))


@router.get(
    "/metrics",
    operation_id="metrics",
    response_class=PlainTextResponse,
    responses=errors(*GATE, json_ref=True),
)
def metrics(request: Request, ledger: LedgerDep) -> PlainTextResponse:
    """Prometheus text exposition: status gauges plus request counts and latency histograms."""
    gauges = render_prometheus(build_status(ledger))
    requests: RequestMetrics = request.app.state.metrics
    return PlainTextResponse(gauges + requests.exposition(), media_type=EXPOSITION)


@router.get(
    "/healthz", operation_id="healthz", response_model=HealthzOut, responses=errors(*GATE)
)
async def healthz() -> dict[str, Any]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz", operation_id="readyz", response_model=ReadyOut, responses=errors(*GATE))
def readyz(request: Request, ledger: LedgerDep) -> JSONResponse:
    """Database file in place (R-SRV-10), reachable and at the head revision, else 503."""
    problem = request.app.state.db_watch.check()
    if problem is not None:
        return error_response(503, "not_ready", problem)
    try:
        revision = current_revision(ledger.db)
    except StoreError:
        return error_response(503, "not_ready", "the database cannot be reached")
    if revision != HEAD_REVISION:
        return error_response(503, "not_ready", "the database is not at the head revision")
    return JSONResponse({"status": "ready", "revision": revision})
