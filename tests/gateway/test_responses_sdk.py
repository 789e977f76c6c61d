"""The Responses endpoint with the official Python SDK through a real `ledger serve` (R-FMT-2,
R-FMT-5): plain and streamed, on a native Responses route and translated to OpenAI chat and
Anthropic routes; usage (cached tokens too) settles the reservation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from tests.support.responses_setup import responses_gateway

ROUTES = [("rapid/r1", "/v1/responses"), ("acme/a1", "/v1/chat/completions"),
          ("bolt/b1", "/v1/messages")]  # fmt: skip


def _settled(home: Path) -> list[tuple[object, ...]]:
    with Ledger.open(home).db.engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(
            "SELECT model_key, status, input_tokens, output_tokens, cache_read_tokens"
            " FROM reservations ORDER BY id").all()]  # fmt: skip


@pytest.mark.parametrize(("model", "path"), ROUTES)
def test_responses_create_plain_r_fmt_2(tmp_path: Path, model: str, path: str) -> None:
    reply = Scripted(text="hello there", input_tokens=30, output_tokens=7, cache_read_tokens=12)
    with StandIn(default=reply) as standin, responses_gateway(tmp_path, standin) as gw:
        client = gw.openai()
        raw = client.responses.with_raw_response.create(
            model=model, instructions="be brief", input="say hello", store=False,
            max_output_tokens=100,
        )  # fmt: skip
        answer = raw.parse()
        assert standin.requests[-1].path == path
        assert raw.headers["x-ledger-model"] == model
    assert answer.output_text == "hello there"
    assert answer.model == model
    assert answer.usage is not None
    assert answer.usage.input_tokens == 42
    assert answer.usage.input_tokens_details.cached_tokens == 12
    assert answer.usage.output_tokens == 7
    assert _settled(tmp_path) == [(model, "succeeded", 30, 7, 12)]


@pytest.mark.parametrize(("model", "path"), ROUTES)
def test_responses_create_streamed_r_fmt_2(tmp_path: Path, model: str, path: str) -> None:
    reply = Scripted(text="streamed words here", input_tokens=20, output_tokens=9,
                     cache_read_tokens=4)  # fmt: skip
    with StandIn(default=reply) as standin, responses_gateway(tmp_path, standin) as gw:
        client = gw.openai()
        deltas: list[str] = []
        kinds: list[str] = []
        with client.responses.stream(model=model, input="go", store=False) as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
            final = stream.get_final_response()
        assert standin.requests[-1].path == path
    assert "".join(deltas) == "streamed words here"
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert "response.output_item.done" in kinds
    assert final.output_text == "streamed words here"
    assert final.usage is not None
    assert final.usage.input_tokens == 24
    assert final.usage.input_tokens_details.cached_tokens == 4
    assert _settled(tmp_path) == [(model, "succeeded", 20, 9, 4)]


def test_responses_tool_call_translated_r_fmt_2(tmp_path: Path) -> None:
    """A function tool, its call and its result, translated to a chat route and back."""
    reply = Scripted(text="", tool_call=("lookup", '{"q": "x"}'))
    with StandIn(default=reply) as standin, responses_gateway(tmp_path, standin) as gw:
        client = gw.openai()
        tools: list[Any] = [{"type": "function", "name": "lookup", "description": "find",
                  "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]
        first = client.responses.create(model="acme/a1", input="find x", tools=tools,
                                        store=False)
        call = first.output[-1]
        assert call.type == "function_call"
        assert (call.name, call.arguments) == ("lookup", '{"q": "x"}')
        standin.default = Scripted(text="found it")
        second = client.responses.create(
            model="acme/a1", store=False, tools=tools,
            input=[{"role": "user", "content": "find x"},
                   {"type": "function_call", "call_id": call.call_id, "name": "lookup",
                    "arguments": call.arguments},
                   {"type": "function_call_output", "call_id": call.call_id, "output": "x=1"}],
        )  # fmt: skip
        sent = standin.bodies[-1]
    assert second.output_text == "found it"
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool"]
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": call.call_id, "content": "x=1"}


def test_stored_request_needs_native_route_r_fmt_2(tmp_path: Path) -> None:
    """`store` omitted (the API's default) keeps a request off translated routes: a 400 naming
    why when its chain holds no native route, nothing sent upstream."""
    chains = {"chains": {"acme/a1": ["bolt/b1"]}}
    with StandIn() as standin, responses_gateway(tmp_path, standin, **chains) as gw:
        client = gw.openai()
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model="acme/a1", input="hi")
        assert standin.requests == []
    assert "`store`" in str(raised.value)


def test_translation_drops_only_documented_hints_and_says_so_r_fmt_2(tmp_path: Path) -> None:
    """What Codex sends beside its turn (a prompt-cache key, `include`, a reasoning summary,
    hosted tools) is left out on a chat route and named in `x-ledger-dropped`; a native route
    gets it all, and says nothing."""
    extra: dict[str, Any] = {
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k1",
        "reasoning": {"summary": "auto"},
        "tools": [{"type": "web_search"},
                  {"type": "function", "name": "f", "parameters": {"type": "object"}}],
    }  # fmt: skip
    with StandIn() as standin, responses_gateway(tmp_path, standin) as gw:
        client = gw.openai()
        translated = client.responses.with_raw_response.create(
            model="acme/a1", input="x", store=False, **extra
        )
        chat_body = standin.bodies[-1]
        native = client.responses.with_raw_response.create(
            model="rapid/r1", input="x", store=False, **extra
        )
        native_body = standin.bodies[-1]
    assert translated.headers["x-ledger-dropped"] == (
        "include,prompt_cache_key,reasoning.summary,hosted-tools"
    )
    assert [t["function"]["name"] for t in chat_body["tools"]] == ["f"]
    assert not {"include", "prompt_cache_key", "reasoning"} & set(chat_body)
    assert "x-ledger-dropped" not in native.headers
    assert native_body["tools"] == extra["tools"]
    assert native_body["include"] == extra["include"]


def test_chat_and_messages_callers_on_a_responses_route_r_fmt_2(tmp_path: Path) -> None:
    """The other direction: OpenAI chat and Anthropic callers served by a native Responses
    route, plain and streamed, translated through the internal form (usage settled)."""
    reply = Scripted(text="from responses", input_tokens=15, output_tokens=5)
    with StandIn(default=reply) as standin, responses_gateway(tmp_path, standin) as gw:
        messages: Any = [{"role": "user", "content": "hi"}]
        chat = gw.openai().chat.completions.create(model="rapid/r1", messages=messages)
        chunks = gw.openai().chat.completions.create(model="rapid/r1", messages=messages,
                                                     stream=True)  # fmt: skip
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        message = gw.anthropic().messages.create(model="rapid/r1", max_tokens=50,
                                                 messages=messages)  # fmt: skip
        with gw.anthropic().messages.stream(model="rapid/r1", max_tokens=50,
                                            messages=messages) as stream:  # fmt: skip
            anthropic_streamed = "".join(stream.text_stream)
        paths = {r.path for r in standin.requests}
    assert paths == {"/v1/responses"}
    assert chat.choices[0].message.content == streamed == "from responses"
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == 15
    assert message.content[0].text == anthropic_streamed == "from responses"  # type: ignore[union-attr]
    assert [row[1:4] for row in _settled(tmp_path)] == [("succeeded", 15, 5)] * 4
