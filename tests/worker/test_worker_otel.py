"""R-OTEL-1 for `ledger worker run`: a span per queue item, a CLIENT span per attempt (the primary,
the corrective prompt, the fallback), exported over OTLP/HTTP to a real receiver."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ledger.standin.server import Scripted, StandIn
from tests.support.otel_handler import PROMPT
from tests.support.otlp_receiver import Receiver
from tests.support.queue_setup import (
    ROOT,
    STANDIN_ENV,
    cli_env,
    open_ledger,
    standin_home,
    worker_argv,
)

REPLY = "WORKER-REPLY-MARKER-8a0f"
INTERNAL, CLIENT = 1, 3


def test_r_otel_1_worker_items_trace_primary_correction_and_fallback(tmp_path: Path) -> None:
    with Receiver() as receiver, StandIn(default=Scripted(text=REPLY)) as standin:
        home = standin_home(tmp_path / "state", standin)
        led = open_ledger(home)
        led.add_source("doc-7", "payload")
        led.close()
        env = cli_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="50")
        done = subprocess.run(
            worker_argv(home, "--once", "--json", "--handler",
                        "tests.support.otel_handler:contract_handler"),
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert len(standin.requests) == 3
    # the worker flushed its queue before it exited: everything is here already
    items = [s for s in receiver.spans if s.name == "ledger queue item"]
    attempts = [s for s in receiver.spans if s.kind == CLIENT]
    assert len(attempts) == 3
    assert [s.kind for s in items] == [INTERNAL] * len(items)
    by_id = {s.span_id: s for s in items}
    assert all(a.parent_id in by_id for a in attempts)
    assert {s.attributes["ledger.source"] for s in receiver.spans} == {"doc-7"}
    attempts.sort(key=lambda s: s.attributes["ledger.reservation.id"])
    a = [s.attributes for s in attempts]
    assert [x["ledger.attempt.role"] for x in a] == ["primary", "correction", "fallback"]
    assert a[0]["gen_ai.request.model"] == a[1]["gen_ai.request.model"] == "m1"
    assert a[2]["gen_ai.request.model"] != "m1"
    assert [x["gen_ai.provider.name"] for x in a[:2]] == ["p1", "p1"]
    assert all(x["gen_ai.request.max_tokens"] == 1024 for x in a)
    for failed in a[:2]:
        assert failed["error.type"] == failed["ledger.policy.kind"] == "invalid_output"
        assert failed["ledger.policy.reason"] == "json_contract"
    assert a[0]["ledger.policy.next"] == "correction"
    assert "error.type" not in a[2]
    assert a[2]["gen_ai.usage.input_tokens"] == 10
    assert a[2]["gen_ai.usage.output_tokens"] == 5
    # the primary and its correction are one item; the fallback another, or the same
    assert attempts[0].parent_id == attempts[1].parent_id
    item_of_last = by_id[attempts[2].parent_id]
    assert item_of_last.attributes["ledger.item.outcome"] == "done"
    assert by_id[attempts[0].parent_id].attributes["ledger.attempts"] >= 2
    everything = b"".join(receiver.raw)
    for secret in (PROMPT, REPLY, *STANDIN_ENV.values()):
        assert secret.encode() not in everything
