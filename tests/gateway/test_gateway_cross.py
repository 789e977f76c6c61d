"""R-GW-3: across wire formats. An OpenAI-format caller served by an Anthropic route and the
reverse (as primary and as backup), for text and tool calls, streaming and not; a request outside
the common subset excludes other-format routes with reason `wire_format`."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway

TOOLS = [
    {"type": "function", "function": {
        "name": "lookup", "description": "find a thing",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
]  # fmt: skip


def test_r_gw_3_openai_caller_served_by_an_anthropic_route(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        answer = gw.openai().chat.completions.create(
            model="bolt/b1",
            messages=[{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "hello"}],
            max_tokens=50, stop=["END"],
        )  # fmt: skip
        assert answer.model == "bolt/b1"
        assert answer.choices[0].message.content == '{"ok": true}'
        assert answer.choices[0].finish_reason == "stop"
        assert answer.usage is not None
        assert answer.usage.completion_tokens == 5
        assert standin.requests[0].path == "/v1/messages"
        sent = standin.bodies[0]
        assert sent["system"] == "be brief"
        assert sent["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "hello"}]}
        ]
        assert sent["max_tokens"] == 50
        assert sent["stop_sequences"] == ["END"]


def test_r_gw_3_openai_tool_calls_through_an_anthropic_route(home: Path) -> None:
    call = Scripted(text="", tool_call=("lookup", '{"q": "x"}'))
    with StandIn({"b1": [call]}) as standin, gateway(home, standin) as gw:
        client = gw.openai()
        answer = client.chat.completions.create(
            model="bolt/b1",
            messages=[{"role": "user", "content": "find x"}],
            tools=TOOLS,
            tool_choice="auto",
        )  # type: ignore[call-overload]
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls is not None
        tool = choice.message.tool_calls[0]
        assert tool.function.name == "lookup"
        assert json.loads(tool.function.arguments) == {"q": "x"}
        assert standin.bodies[0]["tools"][0]["input_schema"]["properties"] == {
            "q": {"type": "string"}
        }
        assert standin.bodies[0]["tool_choice"] == {"type": "auto"}
        client.chat.completions.create(
            model="bolt/b1", tools=TOOLS,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "find x"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": tool.id, "type": "function",
                           "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]},
                      {"role": "tool", "tool_call_id": tool.id, "content": "found"}],
        )  # fmt: skip
        second = standin.bodies[1]["messages"]
        assert second[1]["content"][0] == {"type": "tool_use", "id": tool.id, "name": "lookup",
                                           "input": {"q": "x"}}  # fmt: skip
        assert second[2]["content"][0] == {"type": "tool_result", "tool_use_id": tool.id,
                                           "content": "found"}  # fmt: skip


def test_r_gw_3_anthropic_caller_served_by_an_openai_route_with_tools(home: Path) -> None:
    call = Scripted(text="", tool_call=("lookup", '{"q": "y"}'))
    with StandIn({"a1": [Scripted(text="hi there"), call]}) as standin, \
            gateway(home, standin) as gw:  # fmt: skip
        client = gw.anthropic()
        message = client.messages.create(
            model="acme/a1",
            max_tokens=40,
            system="terse",
            messages=[{"role": "user", "content": "hello"}],
        )
        assert message.model == "acme/a1"
        assert message.content[0].text == "hi there"  # type: ignore[union-attr]
        assert message.stop_reason == "end_turn"
        assert standin.requests[0].path == "/v1/chat/completions"
        assert standin.bodies[0]["messages"][0] == {"role": "system", "content": "terse"}
        tools = [{"name": "lookup", "description": "d",
                  "input_schema": {"type": "object", "properties": {}}}]  # fmt: skip
        used = client.messages.create(
            model="acme/a1",
            max_tokens=40,
            tools=tools,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "find y"}],
        )
        assert used.stop_reason == "tool_use"
        block = used.content[-1]
        assert block.type == "tool_use"
        assert block.input == {"q": "y"}
        assert standin.bodies[1]["tools"][0]["function"]["name"] == "lookup"


def test_r_gw_3_streams_across_formats_both_ways(home: Path) -> None:
    text = "alpha beta gamma delta"
    script = {"b1": [Scripted(text=text)], "a1": [Scripted(text=text, output_tokens=11)]}
    with StandIn(script) as standin, gateway(home, standin) as gw:
        stream = gw.openai().chat.completions.create(
            model="bolt/b1", messages=[{"role": "user", "content": "x"}], stream=True,
            stream_options={"include_usage": True},  # the usage chunk, asked for
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].usage is not None
        with gw.anthropic().messages.stream(
            model="acme/a1", max_tokens=40, messages=[{"role": "user", "content": "x"}]
        ) as astream:
            got = "".join(astream.text_stream)
            final = astream.get_final_message()
        assert got == text
        assert final.usage.output_tokens == 11
        assert final.model == "acme/a1"
        assert [r.path for r in standin.requests] == ["/v1/messages", "/v1/chat/completions"]


def test_r_gw_3_a_backup_of_the_other_format(home: Path) -> None:
    policy = {"fallbackModels": ["bolt/b1"]}
    with StandIn({"a1": [Scripted(status=503)] * 4}) as standin, \
            gateway(home, standin, **policy) as gw:  # fmt: skip
        raw = gw.openai().chat.completions.with_raw_response.create(
            model="acme/a1", messages=[{"role": "user", "content": "x"}]
        )
        assert raw.parse().model == "bolt/b1"
        assert raw.headers["x-ledger-fallback-from"] == "acme/a1"
        assert gw.models_asked() == ["a1", "a1", "b1"]


def test_r_gw_3_outside_the_common_subset_excludes_other_formats(home: Path) -> None:
    policy = {"fallbackModels": ["bolt/b1"]}
    with StandIn({"a1": [Scripted(status=429)] * 4}) as standin, \
            gateway(home, standin, **policy) as gw:  # fmt: skip
        client = gw.openai()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model="bolt/b1", messages=[{"role": "user", "content": "x"}], logprobs=True
            )
        assert info.value.code == "wire_format"
        assert standin.requests == []
        with pytest.raises(openai.RateLimitError) as limited:  # no other-format backup
            client.chat.completions.create(
                model="acme/a1", messages=[{"role": "user", "content": "x"}], logprobs=True
            )
        assert limited.value.code == "rate_limit"
        assert gw.models_asked() == ["a1"]
