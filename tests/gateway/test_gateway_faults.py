"""R-GW-4, R-GW-5, R-GW-7: the issue's fault table through the gateway, streaming, with the
official OpenAI SDK against a real service and the stand-in. Stream faults before the first content
event are recovered; after it they end the stream and the stand-in proves no second model was asked.
The README table "Gateway faults" lists the same rows."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest

from ledger.api import Ledger
from ledger.client import outcome_json
from ledger.errors import UsageError
from ledger.records import Cancelled
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway

IDLE_MS = 1000
POLICY = {"timeoutMs": 20000, "gateway": {"firstTokenMs": 1500, "idleMs": IDLE_MS}}
TEXT = "one two three four five six"


@dataclass(frozen=True)
class Fault:
    """A fault row: what the primary does, what the caller sees, which models were asked."""

    name: str
    replies: tuple[Scripted, ...]
    sees: str  # "answer" or "error event" or an HTTP error code
    asked: tuple[str, ...]
    idle: bool = False  # the error event comes within idleMs (and 1 s) of the last content


FAULTS = [
    Fault("429 short Retry-After", (Scripted(status=429, retry_after="1"),), "answer",
          ("a1", "a1")),
    Fault("429 persistent", (Scripted(status=429),) * 4, "answer", ("a1", "c1")),
    Fault("500 once", (Scripted(status=500),), "answer", ("a1", "a1")),
    Fault("503 persistent", (Scripted(status=503),) * 4, "answer", ("a1", "a1", "c1")),
    Fault("reset before headers", (Scripted(reset=True),), "answer", ("a1", "a1")),
    Fault("no response", (Scripted(delay_s=4),) * 4, "answer", ("a1", "a1", "c1")),
    Fault("slow first token", (Scripted(first_event_delay_s=0.5, text=TEXT),), "answer", ("a1",)),
    Fault("cut before content", (Scripted(cut_after=0),), "answer", ("a1", "a1")),
    Fault("malformed before content", (Scripted(malformed_after=0),), "answer", ("a1", "a1")),
    Fault("cut mid-answer", (Scripted(cut_after=1, text=TEXT),), "error event", ("a1",)),
    Fault("stall", (Scripted(stall_after=1, text=TEXT),), "error event", ("a1",), idle=True),
    Fault("malformed chunk", (Scripted(malformed_after=1, text=TEXT),), "error event", ("a1",)),
    Fault("error event mid-answer", (Scripted(error_event_after=1, text=TEXT),), "error event",
          ("a1",)),
    Fault("transport error mid-answer", (Scripted(transport_error_after=1, text=TEXT),),
          "error event", ("a1",)),
    Fault("oversized event before content", (Scripted(big_event_mib=5, text=TEXT),) * 2,
          "answer", ("a1", "a1", "c1")),
    Fault("no terminator", (Scripted(no_terminator=True, text=TEXT),), "answer", ("a1",)),
    Fault("context exceeded", (Scripted(status=400, error_code="context_length_exceeded"),),
          "answer", ("a1", "c1")),
    Fault("content-filter 400", (Scripted(status=400, error_code="content_policy_violation"),),
          "safety", ("a1",)),
]  # fmt: skip


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_r_gw_5_stream_fault_table(home: Path, fault: Fault) -> None:
    with StandIn({"a1": list(fault.replies)}) as standin, gateway(home, standin, **POLICY) as gw:
        client = gw.openai()
        text: list[str] = []
        seen = "answer"
        model = None
        last = ended = time.monotonic()
        try:
            with client.chat.completions.create(
                model="acme/a1", messages=[{"role": "user", "content": "x"}], stream=True
            ) as stream:
                for chunk in stream:
                    last = time.monotonic()
                    model = chunk.model
                    for choice in chunk.choices:
                        text.append(choice.delta.content or "")
        except openai.APIStatusError as error:
            seen = str(error.code)
        except openai.APIError:
            ended = time.monotonic()
            seen = "error event"
        assert seen == fault.sees
        if fault.idle:  # R-GW-5: gateway.idleMs ends it, not the deadline (20 s)
            assert ended - last <= IDLE_MS / 1000 + 1
        time.sleep(0.2)
        assert tuple(gw.models_asked()) == fault.asked
        if seen == "answer":
            assert model == ("cirrus/c1" if fault.asked[-1] == "c1" else "acme/a1")
            assert "".join(text)
        if seen == "error event":
            assert text  # the caller had content before the stream ended
            # R-GW-5: settled as the failure it is, and nothing may follow it: no retry, no
            # fallback permitted (follow_up none) and no second reservation made
            assert _follow_ups(home) == [("failed", "transport", None)]


def test_r_gw_5_anthropic_stream_and_usage(home: Path) -> None:
    with StandIn({"b1": [Scripted(text=TEXT, input_tokens=7, output_tokens=9)]}) as standin, \
            gateway(home, standin) as gw:  # fmt: skip
        with gw.anthropic().messages.stream(
            model="bolt/b1", max_tokens=50, messages=[{"role": "user", "content": "x"}]
        ) as stream:
            got = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert got == TEXT
        assert final.model == "bolt/b1"
        assert final.stop_reason == "end_turn"
    rows = _reservations(home)
    assert rows == [("bolt/b1", "succeeded", 7, 9, None)]


def test_r_gw_5_stream_without_usage_is_settled_at_its_estimate_marked(home: Path) -> None:
    with StandIn({"a1": [Scripted(text=TEXT, no_usage=True)]}) as standin, \
            gateway(home, standin) as gw:  # fmt: skip
        stream = gw.openai().chat.completions.create(
            model="acme/a1", messages=[{"role": "user", "content": "x"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == TEXT
        assert standin.bodies[0]["stream_options"] == {"include_usage": True}
    rows = _reservations(home)
    assert rows == [("acme/a1", "succeeded", None, None, "usage_estimated")]
    with Ledger.open(home).db.engine.connect() as conn:
        cost, estimate = conn.exec_driver_sql(
            "SELECT cost_micro, estimate_micro FROM reservations"
        ).one()
    assert cost == estimate > 0  # never free


def test_r_gw_7_disconnect_closes_upstream_and_settles_cancelled(home: Path) -> None:
    # OpenAI: no usage chunk arrived before the cut, so nothing was seen: the estimate, marked
    slow = Scripted(text="x" * 60, stream_pieces=60, event_delay_s=0.2)
    with StandIn({"a1": [slow]}) as standin, gateway(home, standin) as gw:
        stream = gw.openai().chat.completions.create(
            model="acme/a1", messages=[{"role": "user", "content": "x"}], stream=True
        )
        for n, _ in enumerate(stream):
            if n == 2:
                break
        stream.close()
        _wait_closed_and_settled(home, standin)
    assert _reservations(home) == [("acme/a1", "cancelled", None, None, "usage_estimated")]
    cost, estimate = _costs(home)[0]
    assert cost == estimate > 0  # never free


def _leave_anthropic_stream_at(home: Path, slow: Scripted, event_type: str) -> None:
    """An Anthropic SDK caller streams from bolt/b1 and leaves at the first `event_type`; returns
    once the stand-in saw its upstream request closed and the reservation is settled."""
    with StandIn({"b1": [slow]}) as standin, gateway(home, standin) as gw:
        with gw.anthropic().messages.create(
            model="bolt/b1", max_tokens=50, messages=[{"role": "user", "content": "x"}],
            stream=True,
        ) as stream:  # fmt: skip
            for event in stream:
                if event.type == event_type:
                    break
        _wait_closed_and_settled(home, standin)


def test_r_gw_7_anthropic_disconnect_settles_with_the_input_tokens_seen(home: Path) -> None:
    # message_start carried the input tokens; the output count (message_delta) never came
    slow = Scripted(text="y" * 60, stream_pieces=60, event_delay_s=0.2, input_tokens=7)
    _leave_anthropic_stream_at(home, slow, "content_block_delta")
    assert _reservations(home) == [("bolt/b1", "cancelled", 7, None, "usage_estimated")]
    cost, estimate = _costs(home)[0]
    assert cost == estimate > 0  # incomplete usage: never less than the call may have cost


def test_r_gw_7_disconnect_after_the_final_usage_settles_at_the_actual_cost(home: Path) -> None:
    # the caller leaves after message_delta (both counts seen), before message_stop
    slow = Scripted(text="z z", stream_pieces=2, event_delay_s=1.5, input_tokens=7,
                    output_tokens=9)  # fmt: skip
    _leave_anthropic_stream_at(home, slow, "message_delta")
    assert _reservations(home) == [("bolt/b1", "cancelled", 7, 9, None)]
    cost, estimate = _costs(home)[0]
    assert cost == 7 * 3 + 9 * 6 < estimate  # b1: 3 and 6 USD/MTok, in micro-USD


def _wait_closed_and_settled(home: Path, standin: StandIn) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        standin.closed_early == 0 or _reservations(home)[0][1] == "open"
    ):
        time.sleep(0.1)
    assert standin.closed_early == 1


def _costs(home: Path) -> list[tuple[int, int]]:
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT cost_micro, estimate_micro FROM reservations ORDER BY id"
        ).all()
    return [(int(r[0]), int(r[1])) for r in rows]


def _follow_ups(home: Path) -> list[tuple[object, ...]]:
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT status, kind, follow_up FROM reservations ORDER BY id"
        ).all()
    return [tuple(r) for r in rows]


def _reservations(home: Path) -> list[tuple[object, ...]]:
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT model_key, status, input_tokens, output_tokens, subkind FROM reservations"
            " ORDER BY id"
        ).all()
    return [tuple(r) for r in rows]


def test_r_gw_6_anthropic_refusal_in_a_stream_request(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin, callsPerHour=1) as gw:
        gw.anthropic().messages.create(
            model="bolt/b1", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
        with (
            pytest.raises(anthropic.RateLimitError),
            gw.anthropic().messages.stream(
                model="bolt/b1", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            ) as stream,
        ):
            list(stream.text_stream)
        assert len(standin.requests) == 1


def test_r_gw_7_non_streaming_caller_that_leaves_settles_cancelled(home: Path) -> None:
    with StandIn({"a1": [Scripted(delay_s=10)]}) as standin, gateway(home, standin) as gw:
        client = openai.OpenAI(
            base_url=gw.url + "/openai/v1", api_key=gw.token, max_retries=0, timeout=4.0
        )
        gw.clients.append(client)
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(
                model="acme/a1", messages=[{"role": "user", "content": "x"}]
            )
        assert gw.models_asked() == ["a1"]  # the upstream call was under way
        deadline = time.monotonic() + 5  # well before the stand-in's 10 s reply
        while time.monotonic() < deadline and _reservations(home)[0][1] == "open":
            time.sleep(0.1)
        # no usage was seen: the estimate counts, marked (R-GW-7)
        assert _reservations(home) == [("acme/a1", "cancelled", None, None, "usage_estimated")]
        assert gw.models_asked() == ["a1"]  # nothing more was sent


def test_r_gw_7_the_service_client_refuses_usage_it_cannot_send() -> None:
    # the service's `cancelled` outcome has no usage fields: never dropped silently
    assert outcome_json(Cancelled()) == {"result": "cancelled"}
    with pytest.raises(UsageError):
        outcome_json(Cancelled(input_tokens=7))
