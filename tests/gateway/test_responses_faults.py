"""The chat endpoint's fault table on the Responses endpoint (R-FMT-2, R-GW-4, R-GW-5, R-GW-6),
streamed through the official Python SDK against a real `ledger serve` and the stand-in: faults
before the first content event are retried or fall back to the chain's backup (r1 -> r2); after
it the stream ends with the Responses `error` event and nothing is replayed; refusals are 429s
with the reason code, nothing sent upstream."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_keys import _new_key
from tests.support.responses_setup import responses_gateway

IDLE_MS = 1000
POLICY = {"timeoutMs": 20000, "gateway": {"firstTokenMs": 1500, "idleMs": IDLE_MS},
          "chains": {"rapid/r1": ["rover/r2"]}}  # fmt: skip
TEXT = "one two three four five six"


@dataclass(frozen=True)
class Fault:
    name: str
    replies: tuple[Scripted, ...]
    sees: str  # "answer", "error event" or an HTTP error code
    asked: tuple[str, ...]


FAULTS = [
    Fault("429 short Retry-After", (Scripted(status=429, retry_after="1"),), "answer",
          ("r1", "r1")),
    Fault("429 persistent", (Scripted(status=429),) * 4, "answer", ("r1", "r2")),
    Fault("503 persistent", (Scripted(status=503),) * 4, "answer", ("r1", "r1", "r2")),
    Fault("first-event stall", (Scripted(first_event_delay_s=4),) * 4, "answer",
          ("r1", "r1", "r2")),
    Fault("cut before content", (Scripted(cut_after=0),), "answer", ("r1", "r1")),
    Fault("cut mid-answer", (Scripted(cut_after=1, text=TEXT),), "error event", ("r1",)),
    Fault("idle stall mid-answer", (Scripted(stall_after=1, text=TEXT),), "error event",
          ("r1",)),
    Fault("error event mid-answer", (Scripted(error_event_after=1, text=TEXT),), "error event",
          ("r1",)),
    Fault("content-filter 400", (Scripted(status=400, error_code="content_policy_violation"),),
          "safety", ("r1",)),
]  # fmt: skip


def _rows(home: Path) -> list[tuple[object, ...]]:
    with Ledger.open(home).db.engine.connect() as conn:
        sql = "SELECT model_key, status, follow_up FROM reservations ORDER BY id"
        return [tuple(r) for r in conn.exec_driver_sql(sql).all()]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_responses_stream_fault_table_r_fmt_2(tmp_path: Path, fault: Fault) -> None:
    with StandIn({"r1": list(fault.replies)}, default=Scripted(text=TEXT)) as standin, \
            responses_gateway(tmp_path, standin, **POLICY) as gw:  # fmt: skip
        client = gw.openai()
        text: list[str] = []
        seen = "answer"
        last = ended = time.monotonic()
        model = None
        try:
            with client.responses.stream(model="rapid/r1", input="x", store=False) as stream:
                for event in stream:
                    last = time.monotonic()
                    if event.type == "response.output_text.delta":
                        text.append(event.delta)
                    elif event.type == "error":
                        seen, ended = "error event", time.monotonic()
                    elif event.type == "response.completed":
                        model = event.response.model
        except openai.APIStatusError as error:
            seen = str(error.code)
        except openai.APIError:
            seen, ended = "error event", time.monotonic()
        asked = tuple(r.model for r in standin.requests)
    assert seen == fault.sees
    assert asked == fault.asked
    if seen == "answer":
        assert "".join(text) == TEXT
        assert model == ("rover/r2" if asked[-1] == "r2" else "rapid/r1")
    if seen == "error event":
        assert text  # content came first: it is never replayed (one model asked, one attempt)
        assert _rows(tmp_path) == [("rapid/r1", "failed", None)]
        assert ended - last <= IDLE_MS / 1000 + 1


def test_responses_plain_5xx_then_backup_r_fmt_2(tmp_path: Path) -> None:
    """Not streamed: a persistent 5xx is retried once, then the chain's backup answers."""
    replies = [Scripted(status=500)] * 4
    with StandIn({"r1": replies}, default=Scripted(text="from backup")) as standin, \
            responses_gateway(tmp_path, standin, **POLICY) as gw:  # fmt: skip
        raw = gw.openai().responses.with_raw_response.create(model="rapid/r1", input="x",
                                                             store=False)  # fmt: skip
        answer = raw.parse()
        asked = [r.model for r in standin.requests]
    assert asked == ["r1", "r1", "r2"]
    assert answer.output_text == "from backup"
    assert answer.model == "rover/r2"
    assert raw.headers["x-ledger-fallback-from"] == "rapid/r1"


def test_responses_budget_refusal_r_fmt_2(tmp_path: Path) -> None:
    """A spent budget is a 429 with the reason code, plain and streamed; nothing upstream."""
    with StandIn() as standin, responses_gateway(tmp_path, standin, callsPerHour=1) as gw:
        client = gw.openai()
        client.responses.create(model="rapid/r1", input="x", store=False)
        with pytest.raises(openai.RateLimitError) as plain:
            client.responses.create(model="rapid/r1", input="x", store=False)
        with pytest.raises(openai.RateLimitError) as streamed, \
                client.responses.stream(model="rapid/r1", input="x", store=False) as stream:
            list(stream)  # fmt: skip
        assert len(standin.requests) == 1
    assert plain.value.code == streamed.value.code == "shared_hourly_budget"


def test_responses_gateway_key_and_its_scope_r_fmt_4(tmp_path: Path) -> None:
    """A gateway key opens the Responses endpoint (R-FMT-4's endpoint list) and puts its
    requests under its scopes (R-SC-1, R-SC-3): the scope's second call is refused, unsent."""
    scoped = {"scopes": {"slots": {"callsPerHour": 1}}}
    with StandIn() as standin, responses_gateway(tmp_path, standin, **scoped) as gw:
        key = _new_key(tmp_path, "codex")
        client = openai.OpenAI(base_url=gw.url + "/openai/v1", api_key=key, max_retries=0)
        with client:
            answer = client.responses.create(model="rapid/r1", input="x", store=False)
            with pytest.raises(openai.RateLimitError) as refused:
                client.responses.create(model="rapid/r1", input="x", store=False)
        wrong = openai.OpenAI(base_url=gw.url + "/openai/v1", api_key="not-a-key", max_retries=0)
        with wrong, pytest.raises(openai.AuthenticationError):
            wrong.responses.create(model="rapid/r1", input="x", store=False)
        asked = len(standin.requests)
    assert answer.output_text
    assert refused.value.code == "scope_hourly_budget"
    assert asked == 1
