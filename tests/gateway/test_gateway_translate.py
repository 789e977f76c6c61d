"""R-GW-3: the translator's pure functions, one row per mapping. Every stop reason both ways,
streamed and not; nothing dropped silently (a part with no faithful translation keeps the request
off the other format's routes, named); usage with the prompt cache (R-GW-5c)."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from anthropic.types import StopReason
from openai.types.chat.chat_completion import Choice

from ledger.gateway.formats import Format
from ledger.gateway.formats.translate import (
    AnthropicFromOpenAI,
    OpenAIFromAnthropic,
    reply_for,
    request_for,
)
from ledger.gateway.sse import Event

OPENAI, ANTHROPIC = Format.OPENAI, Format.ANTHROPIC

# Anthropic stop_reason -> OpenAI finish_reason (an Anthropic route answering an OpenAI caller)
TO_OPENAI = [
    ("end_turn", "stop"),
    ("stop_sequence", "stop"),
    ("max_tokens", "length"),
    ("model_context_window_exceeded", "length"),
    ("tool_use", "tool_calls"),
    ("refusal", "content_filter"),
    ("pause_turn", "stop"),
    (None, "stop"),
]
# OpenAI finish_reason -> Anthropic stop_reason (an OpenAI route answering an Anthropic caller)
TO_ANTHROPIC = [
    ("stop", "end_turn"),
    ("length", "max_tokens"),
    ("tool_calls", "tool_use"),
    ("function_call", "tool_use"),
    ("content_filter", "refusal"),
]


def test_r_gw_3_the_tables_cover_every_stop_reason_the_sdks_know() -> None:
    assert {a for a, _ in TO_OPENAI} - {None} == set(typing.get_args(StopReason))
    finish = typing.get_args(Choice.model_fields["finish_reason"].annotation)
    assert {o for o, _ in TO_ANTHROPIC} == set(finish)


def _message(stop: str | None) -> dict[str, Any]:
    return {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "hi"}], "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }  # fmt: skip


def _completion(finish: str, message: dict[str, Any] | None = None) -> dict[str, Any]:
    message = message or {"role": "assistant", "content": "hi", "refusal": None}
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }  # fmt: skip


def _chunks(out: Any) -> list[dict[str, Any]]:
    """The JSON of each `data:` line a translator emitted (`[DONE]` left out)."""
    lines = [ln for piece in out for ln in piece.decode().splitlines() if ln.startswith("data: ")]
    return [json.loads(ln[6:]) for ln in lines if ln != "data: [DONE]"]


def _anthropic_stream(stop: str | None, usage: dict[str, int] | None = None) -> list[Event]:
    start_usage = {"input_tokens": 3, "output_tokens": 1, **(usage or {})}
    return [
        Event("message_start", {"type": "message_start",
                                "message": {"usage": start_usage}}),
        Event("content_block_start", {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "text", "text": ""}}),
        Event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": {"type": "text_delta", "text": "hi"}}),
        Event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        Event("message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": stop, "stop_sequence": None},
                                "usage": {"output_tokens": 2}}),
        Event("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip


def _openai_stream(
    finish: str, delta: dict[str, Any] | None = None, usage: dict[str, Any] | None = None
) -> list[Event]:
    def chunk(d: dict[str, Any], reason: str | None = None) -> Event:
        return Event(None, {"choices": [{"index": 0, "delta": d, "finish_reason": reason}]})

    return [
        chunk({"role": "assistant", "content": ""}),
        chunk(delta or {"content": "hi"}),
        chunk({}, finish),
        Event(None, {"choices": [], "usage": usage or {"prompt_tokens": 3,
                                                       "completion_tokens": 2}}),
        Event(None, None, done=True),
    ]  # fmt: skip


def _to_openai_stream(events: list[Event]) -> list[dict[str, Any]]:
    translator = OpenAIFromAnthropic("m")
    return _chunks([b for e in events for b in translator.feed(e)] + list(translator.finish()))


def _to_anthropic_stream(events: list[Event]) -> list[dict[str, Any]]:
    translator = AnthropicFromOpenAI("m")
    return _chunks([b for e in events for b in translator.feed(e)] + list(translator.finish()))


@pytest.mark.parametrize(("stop", "finish"), TO_OPENAI)
def test_r_gw_3_anthropic_stop_reason_to_openai(stop: str | None, finish: str) -> None:
    answer = reply_for(OPENAI, ANTHROPIC, _message(stop))
    assert answer["choices"][0]["finish_reason"] == finish
    chunks = _to_openai_stream(_anthropic_stream(stop))
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f is not None] == [finish]


@pytest.mark.parametrize(("finish", "stop"), TO_ANTHROPIC)
def test_r_gw_3_openai_finish_reason_to_anthropic(finish: str, stop: str) -> None:
    assert reply_for(ANTHROPIC, OPENAI, _completion(finish))["stop_reason"] == stop
    events = _to_anthropic_stream(_openai_stream(finish))
    deltas = [e for e in events if e["type"] == "message_delta"]
    assert [d["delta"]["stop_reason"] for d in deltas] == [stop]


def test_r_gw_3_an_unknown_finish_reason_ends_the_turn() -> None:
    assert reply_for(ANTHROPIC, OPENAI, _completion("eos"))["stop_reason"] == "end_turn"


# --------------------------------------------------------------------------- OpenAI refusals


def test_r_gw_3_an_openai_refusal_reaches_an_anthropic_caller_as_text() -> None:
    refused = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    message = reply_for(ANTHROPIC, OPENAI, _completion("stop", refused))
    assert message["content"] == [{"type": "text", "text": "I can't help with that."}]
    assert message["stop_reason"] == "refusal"  # as the ledger reads it (classify: safety)
    events = _to_anthropic_stream(_openai_stream("stop", {"refusal": "I can't help."}))
    texts = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
    assert texts == ["I can't help."]
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == [
        "refusal"
    ]


# --------------------------------------------------------------------------- usage (R-GW-5c)


def test_r_gw_5c_openai_caller_prompt_tokens_include_the_cache_streamed_and_not() -> None:
    cache = {"cache_creation_input_tokens": 40, "cache_read_input_tokens": 500}
    document = _message("end_turn")
    document["usage"] = {"input_tokens": 7, "output_tokens": 2, **cache}
    expected = {
        "prompt_tokens": 547, "completion_tokens": 2, "total_tokens": 549,
        "prompt_tokens_details": {"cached_tokens": 500, "cache_write_tokens": 40},
    }  # fmt: skip
    assert reply_for(OPENAI, ANTHROPIC, document)["usage"] == expected
    chunks = _to_openai_stream(_anthropic_stream("end_turn", {"input_tokens": 7, **cache}))
    assert [c["usage"] for c in chunks if "usage" in c] == [expected]


def test_r_gw_5c_message_delta_usage_updates_the_prompt_counts() -> None:
    events = _anthropic_stream("end_turn")
    events[4].data["usage"] = {"output_tokens": 2, "input_tokens": 9,
                               "cache_read_input_tokens": 100}  # fmt: skip
    usage = next(c["usage"] for c in _to_openai_stream(events) if "usage" in c)
    assert usage["prompt_tokens"] == 109
    assert usage["prompt_tokens_details"]["cached_tokens"] == 100


def test_r_gw_5c_anthropic_caller_sees_the_cache_streamed_and_not() -> None:
    usage = {"prompt_tokens": 547, "completion_tokens": 2, "total_tokens": 549,
             "prompt_tokens_details": {"cached_tokens": 500, "cache_write_tokens": 40}}  # fmt: skip
    expected = {"input_tokens": 7, "output_tokens": 2,
                "cache_creation_input_tokens": 40, "cache_read_input_tokens": 500}  # fmt: skip
    document = _completion("stop")
    document["usage"] = usage
    assert reply_for(ANTHROPIC, OPENAI, document)["usage"] == expected
    events = _to_anthropic_stream(_openai_stream("stop", usage=usage))
    assert [e["usage"] for e in events if e["type"] == "message_delta"] == [expected]


# --------------------------------------------------------------------------- requests

HELLO: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
ANTHROPIC_TOOLS = [{"name": "lookup", "input_schema": {"type": "object"}}]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "user", "content": "hi", "name": "ann"}]}, "`messages[0].name`"),
        ({"messages": [{"role": "system", "content": "s", "name": "x"}, *HELLO]},
         "`messages[0].name`"),
        ({"messages": [*HELLO, {"role": "assistant", "content": "no", "refusal": "no"}, *HELLO]},
         "`messages[1].refusal`"),
        ({"messages": [*HELLO, {"role": "assistant", "content": "hi"}]},
         "`messages` (ending on an assistant turn)"),
        ({"messages": [*HELLO, {"role": "system", "content": "late"}]},
         "`messages[1].role` (a system message after the first turn)"),
        ({"messages": HELLO, "parallel_tool_calls": 0}, "`parallel_tool_calls`"),
        ({"messages": HELLO, "stream_options": {"include_usage": True, "x": 1}},
         "`stream_options`"),
        ({"messages": HELLO, "tool_choice": {"type": "function",
                                             "function": {"name": "f", "strict": True}}},
         "`tool_choice`"),
        ({"messages": HELLO, "logprobs": True}, "`logprobs`"),
        ({"messages": HELLO, "some_secret_text": 1}, "a top-level field"),
    ],
)  # fmt: skip
def test_r_gw_3_openai_parts_with_no_anthropic_translation_are_named(
    body: dict[str, Any], field: str
) -> None:
    assert OPENAI.outside({"model": "m", **body}) == field


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [*HELLO, {"role": "assistant", "content": "hi"},
                       {"role": "user", "content": []}]}, "`messages[2].content` (empty)"),
        ({"messages": [{"role": "user", "content": ""}]}, "`messages[0].content` (empty)"),
        ({"messages": [*HELLO, {"role": "assistant", "content": "{"}]},
         "`messages` (ending on an assistant turn)"),
        ({"messages": HELLO, "tools": ANTHROPIC_TOOLS,
          "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
         "`tool_choice.disable_parallel_tool_use`"),
        ({"messages": HELLO, "tool_choice": {"type": "tool"}}, "`tool_choice`"),
        ({"messages": HELLO, "tool_choice": {"type": "none", "disable_parallel_tool_use": True}},
         "`tool_choice`"),
        ({"messages": HELLO, "top_k": 5}, "`top_k`"),
    ],
)  # fmt: skip
def test_r_gw_3_anthropic_parts_with_no_openai_translation_are_named(
    body: dict[str, Any], field: str
) -> None:
    assert ANTHROPIC.outside({"model": "m", "max_tokens": 9, **body}) == field


def test_r_gw_3_parallel_tool_calls_false_translates_both_ways() -> None:
    body = {"model": "m", "messages": HELLO, "tools": OPENAI_TOOLS, "parallel_tool_calls": False}
    assert OPENAI.outside(body) is None
    sent = request_for(OPENAI, ANTHROPIC, body)
    assert sent["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    sent = request_for(OPENAI, ANTHROPIC, {**body, "tool_choice": "required"})
    assert sent["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert "tool_choice" not in request_for(OPENAI, ANTHROPIC, {**body, "tools": []})
    kept = {**body, "parallel_tool_calls": True}  # the default on both sides
    assert "tool_choice" not in request_for(OPENAI, ANTHROPIC, kept)
    choice = {"type": "tool", "name": "lookup", "disable_parallel_tool_use": True}
    back = {"model": "m", "max_tokens": 9, "messages": HELLO, "tools": ANTHROPIC_TOOLS,
            "tool_choice": choice}  # fmt: skip
    assert ANTHROPIC.outside(back) is None
    sent = request_for(ANTHROPIC, OPENAI, back)
    assert sent["parallel_tool_calls"] is False
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    unset = {**back, "tool_choice": {"type": "auto", "disable_parallel_tool_use": False}}
    assert "parallel_tool_calls" not in request_for(ANTHROPIC, OPENAI, unset)


def test_r_gw_3_an_assistant_refusal_is_the_turn_s_text() -> None:
    refused = {"role": "assistant", "content": None, "refusal": "I won't."}
    body = {"model": "m", "messages": [*HELLO, refused, *HELLO]}
    assert OPENAI.outside(body) is None
    sent = request_for(OPENAI, ANTHROPIC, body)
    assert sent["messages"][1] == {"role": "assistant",
                                   "content": [{"type": "text", "text": "I won't."}]}  # fmt: skip


def test_r_gw_3_a_null_valued_message_field_says_nothing() -> None:
    echoed = {"role": "assistant", "content": "hi", "refusal": None, "function_call": None}
    unnamed = {"role": "user", "content": "x", "name": None}
    body = {"model": "m", "messages": [*HELLO, echoed, unnamed]}
    assert OPENAI.outside(body) is None
    assert request_for(OPENAI, ANTHROPIC, body)["messages"][1]["content"] == [
        {"type": "text", "text": "hi"}
    ]
