"""Gateway attempts are ordinary ledger attempts: `source show`, `status`, `trace export` and
`/metrics` (requests, attempts, fallbacks, time to first token, upstream latency by route)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway


def _ledger(home: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), *args],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return result.stdout


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_r_gw_observability_source_show_status_trace_and_metrics(home: Path) -> None:
    script = {"a1": [Scripted(status=500)], "b1": [Scripted(text="streamed answer")]}
    with StandIn(script) as standin, gateway(home, standin) as gw:
        client = gw.openai(**{"X-Ledger-Source": "observed-1"})
        client.chat.completions.create(model="acme/a1", messages=[{"role": "user", "content": "x"}])
        stream = gw.anthropic().messages.create(
            model="bolt/b1", max_tokens=20, stream=True,
            messages=[{"role": "user", "content": "x"}],
        )  # fmt: skip
        list(stream)
        metrics = httpx.get(gw.url + "/metrics", headers={"authorization": f"Bearer {gw.token}"})
        samples = _samples(metrics.text)
        chat = "/openai/v1/chat/completions"
        assert samples[("ledger_gateway_requests_total",
                        (("outcome", "answered"), ("route", chat)))] == 1  # fmt: skip
        for result in ("transport", "ok"):
            key = (("model", "acme/a1"), ("result", result), ("route", chat))
            assert samples[("ledger_gateway_attempts_total", key)] == 1
        assert samples[("ledger_gateway_upstream_seconds_count", (("route", chat),))] == 2
        messages = "/anthropic/v1/messages"
        assert samples[("ledger_gateway_first_token_seconds_count", (("route", messages),))] == 1
        # a stream's request and answering attempt are counted too, once its first bytes are out
        assert samples[("ledger_gateway_requests_total",
                        (("outcome", "answered"), ("route", messages)))] == 1  # fmt: skip
        key = (("model", "bolt/b1"), ("result", "ok"), ("route", messages))
        assert samples[("ledger_gateway_attempts_total", key)] == 1
        assert samples[("ledger_gateway_upstream_seconds_count", (("route", messages),))] == 1
        # the service's own request counter names the gateway routes by template (the gate
        # calls them straight, R-SRV-9), never `unmatched`
        for route in (chat, messages):
            key = (("method", "POST"), ("route", route), ("status", "200"))
            assert samples[("ledger_http_requests_total", key)] == 1
    shown = json.loads(_ledger(home, "source", "show", "observed-1", "--json"))
    roles = [a["role"] for a in shown["attempts"]]
    assert sorted(roles) == ["primary", "retry"]
    status = json.loads(_ledger(home, "status", "--json"))
    assert status["hourly"]["used"] == 3
    trace = _ledger(home, "trace", "export")
    assert trace.count("acme/a1") >= 2
    assert "streamed answer" not in trace
