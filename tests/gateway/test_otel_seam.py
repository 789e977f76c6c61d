"""R-OTEL-1 on the tracing seam in this process (what `ledger serve` calls around a request and
its attempts), exported over OTLP/HTTP to the real receiver: an incoming `traceparent` that is
not sampled keeps its trace unexported (the provider's sampler decides, as the SDK's own spans
would), the standard span limits apply, and the histogram records arrive although the request
path never makes one (its own thread does)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import Histogram

from ledger import telemetry
from ledger.attempt import Attempt
from ledger.kinds import AttemptRole, AttemptStatus
from ledger.records import Reservation, SettleResult, Success
from ledger.telemetry.processor import MetricQueue
from tests.support.otlp_receiver import Receiver

ROUTE = "/openai/v1/chat/completions"
SERVER, CLIENT = 2, 3  # the OTLP span kinds


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as found:
        yield found


def _configure(receiver: Receiver) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "20",
           "OTEL_METRIC_EXPORT_INTERVAL": "60000"}  # fmt: skip
    assert telemetry.configure(env, print)


def _request(number: int, headers: dict[str, str]) -> None:
    """One gateway request with one answered attempt, through the seam as the gateway calls it."""
    with telemetry.gateway_request(headers, ROUTE) as traced:
        reservation = Reservation(number, "job-1", "alpha/small", 0, 1, None,
                                  AttemptRole.PRIMARY, AttemptStatus.OPEN)  # fmt: skip
        attempt: Attempt[None] = Attempt(1, "alpha/small", reservation, "alpha/small", None)
        telemetry.watch(attempt, "alpha", "small", 64)
        telemetry.replied(attempt, {"model": "small-2024"})
        attempt.outcome = Success(input_tokens=10, output_tokens=5)
        attempt.record(SettleResult(number, "job-1", "alpha/small", AttemptStatus.SUCCEEDED,
                                    late=False))  # fmt: skip
        traced.answered(200)


def test_r_otel_1_an_unsampled_callers_trace_is_not_exported(receiver: Receiver) -> None:
    dropped, kept = secrets.token_hex(16), secrets.token_hex(16)
    _configure(receiver)
    try:
        _request(1, {"traceparent": f"00-{dropped}-{secrets.token_hex(8)}-00"})
        caller = secrets.token_hex(8)
        _request(2, {"traceparent": f"00-{kept}-{caller}-01"})
        _request(3, {})
        receiver.wait_for(lambda r: len(r.spans) >= 4)
    finally:
        telemetry.shutdown()
    assert dropped not in {s.trace_id for s in receiver.spans}
    assert len(receiver.spans) == 4
    requests = {s.trace_id: s for s in receiver.spans if s.kind == SERVER}
    assert requests[kept].parent_id == caller
    (own,) = [t for t in requests if t != kept]  # no traceparent: a trace of its own, a root
    assert requests[own].parent_id == ""
    for trace_id, request in requests.items():
        (attempt,) = [s for s in receiver.spans if s.kind == CLIENT and s.trace_id == trace_id]
        assert attempt.parent_id == request.span_id
        assert request.start_ns <= attempt.start_ns <= attempt.end_ns <= request.end_ns


def test_r_otel_1_the_standard_span_limits_apply(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4")
    _configure(receiver)
    try:
        _request(1, {})
        receiver.wait_for(lambda r: len(r.spans) >= 2)
    finally:
        telemetry.shutdown()
    (attempt,) = [s for s in receiver.spans if s.kind == CLIENT]
    assert attempt.attributes["gen_ai.request.model"] == "smal"
    assert attempt.attributes["gen_ai.response.model"] == "smal"
    assert attempt.attributes["gen_ai.usage.input_tokens"] == 10  # numbers are never cut


def test_r_otel_1_histograms_arrive_though_the_request_path_records_none(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    callers: list[str] = []
    real = Histogram.record

    def spy(self: Histogram, *args: Any, **kwargs: Any) -> None:
        callers.append(threading.current_thread().name)
        real(self, *args, **kwargs)

    monkeypatch.setattr(Histogram, "record", spy)
    _configure(receiver)
    try:
        for number in range(1, 4):
            _request(number, {})
        during = list(callers)
    finally:
        telemetry.shutdown()  # records what is queued, then sends the metrics
    assert threading.current_thread().name not in during
    durations = receiver.metrics["gen_ai.client.operation.duration"]
    assert sum(p["count"] for p in durations) == 3
    assert {p["gen_ai.response.model"] for p in durations} == {"small-2024"}
    usage = receiver.metrics["gen_ai.client.token.usage"]
    by_type = {p["gen_ai.token.type"]: p for p in usage}
    assert (by_type["input"]["sum"], by_type["output"]["sum"]) == (30, 15)


def test_r_otel_1_a_full_metric_queue_drops_and_counts() -> None:
    class Taken:
        def __init__(self) -> None:
            self.values: list[float] = []

        def record(self, value: float, attributes: Any = None, context: Any = None) -> None:
            self.values.append(value)

    taken = Taken()
    queue = MetricQueue(max_queue=2, delay_s=60)
    for value in (1.0, 2.0, 3.0):
        queue.record(taken, value, {}, None)  # type: ignore[arg-type]
    assert queue.dropped == 1
    queue.shutdown(1.0)
    assert taken.values == [1.0, 2.0]
