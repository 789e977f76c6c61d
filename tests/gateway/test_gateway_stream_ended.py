"""R-GW-5: a stream that fails after its first content event was sent is never continued
elsewhere, and its settle says so: for each of the gateway's post-content failures the failed
attempt records no follow-up (no retry, no fallback permitted) and no other reservation follows
it, even where the policy table would grant a fallback (here: the model's second transport
strike, which cools it, after a first attempt that failed before any content).

The deadline (R-GW-5b) settles `cancelled`, which permits nothing: see
tests/gateway/test_gateway_stream_deadline.py."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway

POLICY = {"timeoutMs": 20000, "gateway": {"firstTokenMs": 1500, "idleMs": 1000}}
TEXT = "one two three four five six"
FAILURES = {
    "idle stall": Scripted(stall_after=1, text=TEXT),
    "cut without a finish reason": Scripted(cut_after=1, text=TEXT),
    "malformed event": Scripted(malformed_after=1, text=TEXT),
    "upstream error event": Scripted(error_event_after=1, text=TEXT),
    "transport error": Scripted(transport_error_after=1, text=TEXT),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_r_gw_5_a_failure_after_content_permits_no_follow_up(home: Path, failure: str) -> None:
    # a1's first attempt fails before content (a strike; retried on a1), its second after it
    script = {"a1": [Scripted(status=500), FAILURES[failure]]}
    with StandIn(script) as standin, gateway(home, standin, **POLICY) as gw:
        with httpx.stream("POST", gw.url + "/openai/v1/chat/completions", timeout=60,
                          headers={"authorization": f"Bearer {gw.token}"},
                          json={"model": "acme/a1", "stream": True,
                                "messages": [{"role": "user", "content": "x"}]}) as answer:
            assert answer.status_code == 200
            data = [line[6:] for line in answer.iter_lines() if line.startswith("data: ")]
        chunks = [json.loads(d) for d in data]
        assert any(c["choices"][0]["delta"].get("content") for c in chunks[:-1])  # content first
        assert chunks[-1]["error"]["code"] == "upstream_stream_failed"
        assert gw.models_asked() == ["a1", "a1"]  # c1, the backup, never asked
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT model_key, status, kind, follow_up, after_id IS NOT NULL FROM reservations"
            " ORDER BY id"
        ).all()
    assert [tuple(r) for r in rows] == [
        ("acme/a1", "failed", "transport", "retry", False),  # before content: retried
        ("acme/a1", "failed", "transport", None, True),  # after content: nothing follows
    ]
