"""R-GW-5c: prompt-cache tokens are read from a stream exactly as from a whole answer, on the
same-format and translated paths alike, so a streamed answer never costs less than the same
answer unstreamed. Through a real `ledger serve` and the stand-in, which reports the cache tokens
in its streams where the real APIs do (Anthropic's `message_start`, OpenAI's usage chunk)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger.api import Ledger
from ledger.gateway.formats import Format, WireFormat
from ledger.gateway.sse import Event, Tracker
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway

CACHED = Scripted(text="one two three", input_tokens=10, output_tokens=5,
                  cache_write_tokens=100_000, cache_read_tokens=200_000)  # fmt: skip
# the catalog's prices (tests/support/gateway_setup.py), micro-USD: no cache prices, so cache tokens
# cost the input price (never free); a1 1 and 2 USD/MTok, b1 3 and 6
COST = {"acme/a1": 300_010 * 1 + 5 * 2, "bolt/b1": 300_010 * 3 + 5 * 6}
PATHS = {Format.OPENAI: "/openai/v1/chat/completions", Format.ANTHROPIC: "/anthropic/v1/messages"}
CASES = [(caller, model) for caller in Format for model in COST]  # same format and translated


def _ask(http: httpx.Client, caller: WireFormat, model: str, stream: bool) -> int:
    """One answer read to its end; its reservation id."""
    body: dict[str, Any] = {"model": model, "max_tokens": 50, "stream": stream,
                            "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
    with http.stream("POST", PATHS[caller], json=body) as answer:
        assert answer.status_code == 200, answer.read()
        text = answer.read().decode()
    if stream:
        assert "error" not in text
        events = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: {")]  # fmt: skip
        assert events  # a stream in the caller's format came
    return int(answer.headers["x-ledger-reservation"])


def test_r_gw_5c_a_streamed_answer_costs_what_the_same_answer_unstreamed_does(home: Path) -> None:
    with StandIn({"a1": [CACHED] * 4, "b1": [CACHED] * 4}) as standin, \
            gateway(home, standin) as gw, \
            gw.served.client(tcp=True, timeout_s=60) as http:  # fmt: skip
        pairs = {
            (caller, model): (_ask(http, caller, model, False), _ask(http, caller, model, True))
            for caller, model in CASES
        }
    rows = _rows(home)
    for (caller, model), (whole, streamed) in pairs.items():
        assert rows[whole] == ("succeeded", 10, 5, 100_000, 200_000, COST[model]), (caller, model)
        assert rows[streamed] == rows[whole], (caller, model)


def _rows(home: Path) -> dict[int, tuple[object, ...]]:
    with Ledger.open(home).db.engine.connect() as conn:
        found = conn.exec_driver_sql(
            "SELECT id, status, input_tokens, output_tokens, cache_write_tokens,"
            " cache_read_tokens, cost_micro FROM reservations"
        ).all()
    return {int(r[0]): tuple(r[1:]) for r in found}


@pytest.mark.parametrize("final", [False, True], ids=["start only", "final counts in delta"])
def test_r_gw_5c_anthropic_stream_usage_read_as_the_whole_answers(final: bool) -> None:
    # message_start carries the prompt's counts; the API's newer message_delta repeats them
    # (cumulative, the final ones), which then win
    tracker = Tracker(Format.ANTHROPIC)
    start = {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 100,
             "cache_read_input_tokens": 200}  # fmt: skip
    tracker.observe(Event("message_start", {"type": "message_start", "message": {"usage": start}}))
    delta: dict[str, Any] = {"output_tokens": 5}
    if final:
        delta.update(input_tokens=11, cache_creation_input_tokens=101, cache_read_input_tokens=201)
    tracker.observe(Event("message_delta", {"type": "message_delta",
                                            "delta": {"stop_reason": "end_turn"},
                                            "usage": delta}))  # fmt: skip
    counts = (tracker.input_tokens, tracker.output_tokens, tracker.cache_write_tokens,
              tracker.cache_read_tokens)  # fmt: skip
    assert counts == ((11, 5, 101, 201) if final else (10, 5, 100, 200))


def test_r_gw_5c_openai_stream_usage_read_as_the_whole_answers() -> None:
    # prompt_tokens includes the cached ones: the input tokens are the rest
    tracker = Tracker(Format.OPENAI)
    usage = {"prompt_tokens": 310, "completion_tokens": 5,
             "prompt_tokens_details": {"cached_tokens": 200, "cache_write_tokens": 100}}
    tracker.observe(Event(None, {"choices": [], "usage": usage}))
    counts = (tracker.input_tokens, tracker.output_tokens, tracker.cache_write_tokens,
              tracker.cache_read_tokens)  # fmt: skip
    assert counts == (10, 5, 100, 200)
