"""The gateway's Prometheus series (R-SRV-4, R-GW-*): requests, attempts, fallbacks, time to first
token and upstream latency, by route template.

Invariant: every label comes from a fixed set (the three gateway route templates, the catalog's
model keys read once at start, the failure kinds and outcome names, the refusal reason codes, the
policy's scopes and the ledger's gateway key names): nothing a caller sends can add a series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OUTCOMES = frozenset({"answered", "refused", "failed", "bad_request", "stream_failed"})


class GatewayMetrics:
    """The series, registered in the service's registry (so `/metrics` shows them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "ledger_gateway_requests",
            "Gateway requests by route template and outcome.",
            ("route", "outcome"),
            registry=registry,
        )
        self.attempts = Counter(
            "ledger_gateway_attempts",
            "Upstream attempts by route template, model and result (ok or the failure kind).",
            ("route", "model", "result"),
            registry=registry,
        )
        self.fallbacks = Counter(
            "ledger_gateway_fallbacks",
            "Gateway requests answered by another model than the one first asked.",
            ("route",),
            registry=registry,
        )
        self.refusals = Counter(
            "ledger_gateway_refusals",
            "Gateway refusals (429) by reason code, the scope that refused and the gateway key "
            "that asked ('' when none).",
            ("reason", "scope", "key"),
            registry=registry,
        )
        self.first_token = Histogram(
            "ledger_gateway_first_token_seconds",
            "Time from a stream's upstream request to its first content event.",
            ("route",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.upstream = Histogram(
            "ledger_gateway_upstream_seconds",
            "Time of one upstream exchange (to its answer, or to a stream's first content).",
            ("route",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def request(self, route: str, outcome: str) -> None:
        """Count one gateway request's outcome."""
        self.requests.labels(route, outcome if outcome in OUTCOMES else "failed").inc()

    def attempt(self, route: str, model: str, result: str, seconds: float) -> None:
        """Count one upstream attempt and its latency."""
        self.attempts.labels(route, model, result).inc()
        self.upstream.labels(route).observe(seconds)

    def refusal(self, reason: str, scope: str | None, key: str | None) -> None:
        """Count one refusal (R-DIAG-1): a reason code, a policy scope, a ledger key name."""
        self.refusals.labels(reason, scope or "", key or "").inc()
