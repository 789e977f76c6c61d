"""R-OTEL-1 through a real `ledger serve`: the gateway's request and attempt spans, exported over
OTLP/HTTP to a real receiver (tests/support/otlp_receiver.py), decoded with the official protobuf
messages."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx

from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway_catalog
from tests.support.otlp_receiver import Received, Receiver
from tests.support.serving import running

PROMPT = "PROMPT-TEXT-MARKER-7f3a"
REPLY = "REPLY-TEXT-MARKER-91bc"
ERROR_BODY = "UPSTREAM-ERROR-BODY-MARKER-c2d4"
SERVER, CLIENT = 2, 3  # the OTLP span kinds
ERROR = 2  # STATUS_CODE_ERROR


def otel_env(receiver: Receiver, **more: str) -> dict[str, str]:
    """The standard variables pointing `ledger serve` at the receiver, with a short batch delay
    (so the test waits on what arrives, not on a timer)."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        **more,
    }


def _attempts(spans: list[Received], request: Received) -> list[Received]:
    found = [s for s in spans if s.parent_id == request.span_id]
    return sorted(found, key=lambda s: s.attributes["ledger.attempt.number"])


def test_r_otel_1_request_span_with_three_attempt_spans_and_no_text(home: Path) -> None:
    credential = "acme-credential-" + secrets.token_hex(8)
    script = {"a1": [Scripted(status=503, error_message=ERROR_BODY)] * 5}
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with Receiver() as receiver, StandIn(script, default=Scripted(text=REPLY)) as standin:
        catalog = gateway_catalog(standin)
        catalog["providers"]["acme"] = {"credentialEnv": "ACME_KEY", "api": "openai-chat",
                                        "baseUrl": standin.base_url_openai}  # fmt: skip
        (home / "catalog.json").write_text(json.dumps(catalog))
        env = otel_env(receiver, ACME_KEY=credential, OTEL_METRIC_EXPORT_INTERVAL="60000")
        with running(home, "--listen", "127.0.0.1:0", env=env) as served:
            assert served.url is not None
            assert served.token is not None
            answer = httpx.post(
                served.url + "/openai/v1/chat/completions",
                json={"model": "acme/a1", "max_tokens": 300,
                      "messages": [{"role": "user", "content": PROMPT}]},
                headers={"authorization": f"Bearer {served.token}",
                         "x-ledger-source": "job-42",
                         "traceparent": f"00-{caller_trace}-{caller_span}-01"},
                timeout=60,
            )  # fmt: skip
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-ledger-attempts"] == "3"
            assert REPLY in answer.text  # the reply went to the caller, and only there
            receiver.wait_for(lambda r: len(r.spans) >= 4)
            token = served.token
        assert standin.requests[0].headers.get("authorization")  # the credential was sent
    requests = [s for s in receiver.spans if s.kind == SERVER]
    assert len(requests) == 1
    request = requests[0]
    # a child of the caller's span, in the caller's trace (W3C traceparent)
    assert (request.trace_id, request.parent_id) == (caller_trace, caller_span)
    assert request.name == "POST /openai/v1/chat/completions"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["ledger.source"] == "job-42"
    attempts = _attempts(receiver.spans, request)
    assert len(attempts) == 3
    assert [s.name for s in attempts] == ["chat a1", "chat a1", "chat c1"]
    assert {s.kind for s in attempts} == {CLIENT}
    assert {s.trace_id for s in attempts} == {caller_trace}
    a = [s.attributes for s in attempts]
    assert [x["ledger.attempt.role"] for x in a] == ["primary", "retry", "fallback"]
    assert [x["gen_ai.provider.name"] for x in a] == ["acme", "acme", "cirrus"]
    assert [x["gen_ai.request.model"] for x in a] == ["a1", "a1", "c1"]
    assert all(x["gen_ai.operation.name"] == "chat" for x in a)
    assert all(x["gen_ai.request.max_tokens"] == 300 for x in a)
    assert all(x["ledger.source"] == "job-42" for x in a)
    assert all(x["ledger.attempt.probe"] is False for x in a)
    assert a[2]["ledger.reservation.id"] == int(answer.headers["x-ledger-reservation"])
    assert len({x["ledger.reservation.id"] for x in a}) == 3
    for failed, follow_up in zip(a[:2], ("retry", "fallback"), strict=True):
        assert failed["error.type"] == failed["ledger.policy.kind"] == "transport"
        assert failed["ledger.policy.next"] == follow_up
        assert failed["ledger.policy.actions"]  # the policy table's decision, as it recorded it
    assert [s.status for s in attempts[:2]] == [ERROR, ERROR]
    last = a[2]
    assert "error.type" not in last
    assert attempts[2].status != ERROR
    assert last["gen_ai.response.model"] == "c1"
    assert (last["gen_ai.usage.input_tokens"], last["gen_ai.usage.output_tokens"]) == (10, 5)
    assert "gen_ai.usage.cache_read.input_tokens" in last
    # attempts lie inside the request, one after the other
    assert request.start_ns <= attempts[0].start_ns
    assert attempts[0].end_ns <= attempts[1].start_ns <= attempts[2].start_ns
    assert attempts[2].end_ns <= request.end_ns
    # nothing of the conversation, the credential, the caller's token or the error body
    everything = b"".join(receiver.raw)
    for secret in (PROMPT, REPLY, ERROR_BODY, credential, token):
        assert secret.encode() not in everything
    # the metrics, flushed when the service stopped
    assert {"gen_ai.client.operation.duration", "gen_ai.client.token.usage"} <= set(
        receiver.metrics
    )
    durations = receiver.metrics["gen_ai.client.operation.duration"]
    assert sum(p["count"] for p in durations) == 3
    assert {p.get("error.type") for p in durations} == {"transport", None}
    usage = receiver.metrics["gen_ai.client.token.usage"]
    assert {p["gen_ai.token.type"] for p in usage} == {"input", "output"}


def test_r_otel_1_hanging_collector_drops_and_counts_spans(home: Path) -> None:
    """Export never holds a request: with a collector that never answers, every request is
    answered, and the spans the full queue could not take are counted on /metrics."""
    with Receiver(silent=True) as receiver, StandIn() as standin:
        (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
        env = otel_env(receiver, OTEL_BSP_MAX_QUEUE_SIZE="4", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2")
        with running(home, "--listen", "127.0.0.1:0", env=env) as served, \
                served.client(tcp=True) as client:  # fmt: skip
            for _ in range(12):
                answer = client.post("/openai/v1/chat/completions", json={
                    "model": "acme/a1", "messages": [{"role": "user", "content": "x"}]})
                assert answer.status_code == 200
            receiver.wait_for(lambda r: r.requests >= 1)  # the exporter is stuck in its export
            metrics = client.get("/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("ledger_otel_spans_dropped "))
    assert float(line.split()[1]) > 0


def test_r_otel_1_latest_names_and_a_streamed_answer(home: Path) -> None:
    """OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental switches spans and metrics
    together; a streamed answer's request span ends with its stream, after its attempt."""
    with Receiver() as receiver, StandIn(default=Scripted(text=REPLY)) as standin:
        (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
        env = otel_env(receiver, OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental")
        with running(home, "--listen", "127.0.0.1:0", env=env) as served, \
                served.client(tcp=True) as client:  # fmt: skip
            answer = client.post("/openai/v1/chat/completions", json={
                "model": "acme/a1", "stream": True,
                "messages": [{"role": "user", "content": PROMPT}]})
            assert answer.status_code == 200
            assert "data:" in answer.text
            receiver.wait_for(lambda r: len(r.spans) >= 2)
    request = next(s for s in receiver.spans if s.kind == SERVER)
    (attempt,) = _attempts(receiver.spans, request)
    assert attempt.end_ns <= request.end_ns  # the request's span waited for the stream's settle
    assert attempt.attributes["gen_ai.response.time_to_first_chunk"] > 0
    assert attempt.attributes["gen_ai.response.model"] == "a1"  # as the stream's chunks name it
    assert "gen_ai.system" not in attempt.attributes
    assert attempt.attributes["gen_ai.provider.name"] == "acme"
    assert "gen_ai.client.operation.time_to_first_chunk" in receiver.metrics
    assert "gen_ai.server.time_to_first_token" not in receiver.metrics
    everything = b"".join(receiver.raw)
    assert PROMPT.encode() not in everything
    assert REPLY.encode() not in everything


def test_r_otel_1_default_names_are_those_of_v1_36_to_v1_41(home: Path) -> None:
    """The default names; and a refused request's span carries the refusal's reason code."""
    with Receiver() as receiver, StandIn() as standin:
        (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
        (home / "recovery.json").write_text(json.dumps({"callsPerHour": 1}))
        with running(home, "--listen", "127.0.0.1:0", env=otel_env(receiver)) as served, \
                served.client(tcp=True) as client:  # fmt: skip
            body = {"model": "acme/a1", "stream": True,
                    "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
            assert client.post("/openai/v1/chat/completions", json=body).status_code == 200
            assert client.post("/openai/v1/chat/completions", json=body).status_code == 429
            receiver.wait_for(lambda r: len(r.spans) >= 3)
    requests = [s for s in receiver.spans if s.kind == SERVER]
    refused = [s for s in requests if "ledger.refusal.reason" in s.attributes]
    assert [s.attributes["ledger.refusal.reason"] for s in refused] == ["shared_hourly_budget"]
    assert refused[0].attributes["http.response.status_code"] == 429
    (attempt,) = [s for s in receiver.spans if s.kind == CLIENT]
    assert attempt.attributes["gen_ai.system"] == attempt.attributes["gen_ai.provider.name"]
    assert "gen_ai.response.time_to_first_chunk" not in attempt.attributes
    assert "gen_ai.server.time_to_first_token" in receiver.metrics
    assert "gen_ai.client.operation.time_to_first_chunk" not in receiver.metrics
