"""Issue 23 / R-SIM-1: the simulation's provider stand-in hands the REAL classifier raw facts
that it classifies back into the recorded kind and subkind (the stand-in never classifies)."""

from __future__ import annotations

import pytest

from ledger.kinds import FailureKind
from ledger.simulate.provider import Reply, raw_response
from ledger.worker.queue import HandlerResult, classify_result

NOW = 1_800_000_000_000

RECORDED = [
    (FailureKind.AUTH, "http_401", None),
    (FailureKind.AUTH, "http_403", None),
    (FailureKind.QUOTA, "http_402", None),
    (FailureKind.QUOTA, "insufficient_quota", None),
    (FailureKind.RATE_LIMIT, "http_429", None),
    (FailureKind.RATE_LIMIT, "rate_limit_error", None),
    (FailureKind.TRANSPORT, "http_503", None),
    (FailureKind.TRANSPORT, "server_error", None),
    (FailureKind.TRANSPORT, "overloaded_error", None),
    (FailureKind.TRANSPORT, "timeout", None),
    (FailureKind.TRANSPORT, "connect_error", None),
    (FailureKind.TRANSPORT, "stream_cut", None),
    (FailureKind.REQUEST_REJECTED, "context_overflow", None),
    (FailureKind.REQUEST_REJECTED, "http_400", None),
    (FailureKind.INVALID_OUTPUT, "length_stop", None),
    (FailureKind.INVALID_OUTPUT, "reported", "invalid_json"),
    (FailureKind.SAFETY, "content_filter_stop", None),
    (FailureKind.UNKNOWN, "http_409", None),
]


@pytest.mark.parametrize(("kind", "subkind", "reason"), RECORDED)
def test_r_sim_1_recorded_outcomes_classify_back_through_the_real_classifier(
    kind: FailureKind, subkind: str, reason: str | None
) -> None:
    response = raw_response(Reply(kind, subkind, reason), 100)
    assert response is not None
    if response.ok and response.stop_reason == "stop":  # a reply the handler finds invalid JSON
        assert (kind, reason) == (FailureKind.INVALID_OUTPUT, "invalid_json")
        return
    found = classify_result(HandlerResult.failed_call(response), NOW)
    assert (found.kind, found.subkind) == (kind, subkind)


def test_r_sim_1_retry_after_reaches_the_classifier_as_a_header() -> None:
    response = raw_response(Reply(FailureKind.RATE_LIMIT, "http_429", retry_after_ms=30_000), 5)
    assert response is not None
    found = classify_result(HandlerResult.failed_call(response), NOW)
    assert found.retry_after_ms == 30_000


def test_r_sim_1_a_success_is_usable_json_with_its_tokens() -> None:
    response = raw_response(Reply(input_tokens=12, output_tokens=3), 5)
    assert response is not None
    assert response.ok
    assert (response.input_tokens, response.output_tokens) == (12, 3)
