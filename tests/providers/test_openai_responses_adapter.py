"""The `openai-responses` adapter the worker calls (R-HTTP-1, R-FMT-2) against the stand-in's
Responses path: usage (cached tokens apart from the input), the stop reasons the classifier
reads (`length`, `content_filter`), a route's effort as `reasoning.effort`, and errors as facts."""

from __future__ import annotations

import time

from ledger.catalog import Provider
from ledger.kinds import FailureKind
from ledger.providers import CallRequest, Message, ProviderResponse, adapter_for
from ledger.standin.server import Scripted, StandIn
from ledger.targets import Effort
from ledger.worker.queue import classify_response

MESSAGES = (Message("user", "hello"),)


def _now() -> int:
    return int(time.time() * 1000)


def _call(standin: StandIn, reply: Scripted, effort: Effort | None = None) -> ProviderResponse:
    standin.set_script("r1", [reply])
    provider = Provider.model_validate(
        {"api": "openai-responses", "baseUrl": standin.base_url_openai, "available": True}
    )
    request = CallRequest("r1", MESSAGES, 64, _now() + 10_000, effort=effort)
    return adapter_for(provider, {}).call(request, now_ms=_now)


def test_responses_adapter_reads_usage_and_stops_r_fmt_2() -> None:
    with StandIn() as standin:
        ok = _call(standin, Scripted(text="hi", input_tokens=9, output_tokens=4,
                                     cache_read_tokens=3), Effort.HIGH)  # fmt: skip
        sent = standin.bodies[-1]
        length = _call(standin, Scripted(stop_reason="length"))
        filtered = _call(standin, Scripted(stop_reason="content_filter"))
        limited = _call(standin, Scripted(status=429, retry_after="2"))
        paths = {r.path for r in standin.requests}
    assert paths == {"/v1/responses"}
    assert sent["reasoning"] == {"effort": "high"}
    assert sent["max_output_tokens"] == 64
    assert (ok.ok, ok.text, ok.stop_reason) == (True, "hi", "stop")
    assert (ok.input_tokens, ok.cache_read_tokens, ok.output_tokens) == (9, 3, 4)
    assert length.stop_reason == "length"
    found = classify_response(filtered, _now())
    assert found is not None
    assert found.kind is FailureKind.SAFETY
    assert not limited.ok
    limit = classify_response(limited, _now())
    assert limit is not None
    assert limit.kind is FailureKind.RATE_LIMIT
