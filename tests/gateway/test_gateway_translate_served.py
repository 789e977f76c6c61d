"""R-GW-3 and R-GW-5c across wire formats, through a real `ledger serve` and the stand-in with the
official SDKs: a non-default stop reason each way, streamed and not; a part with no translation is
a 400 naming it when only the other format could serve it (and passes unchanged on its own
format); parallel tool use and an assistant refusal translated; the prompt cache in usage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway

HELLO: Any = [{"role": "user", "content": "hello"}]


def test_r_gw_3_a_truncated_answer_says_so_in_either_format(home: Path) -> None:
    script = {"b1": [Scripted(stop_reason="max_tokens")] * 2,
              "a1": [Scripted(stop_reason="length")] * 2}  # fmt: skip
    with StandIn(script) as standin, gateway(home, standin) as gw:
        client = gw.openai()
        answer = client.chat.completions.create(model="bolt/b1", messages=HELLO)
        assert answer.choices[0].finish_reason == "length"
        chunks = list(client.chat.completions.create(model="bolt/b1", messages=HELLO, stream=True))
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert [f for f in finishes if f is not None] == ["length"]
        messages = gw.anthropic().messages
        message = messages.create(model="acme/a1", max_tokens=40, messages=HELLO)
        assert message.stop_reason == "max_tokens"
        with messages.stream(model="acme/a1", max_tokens=40, messages=HELLO) as stream:
            assert stream.get_final_message().stop_reason == "max_tokens"
        assert [r.path for r in standin.requests] == ["/v1/messages"] * 2 + [
            "/v1/chat/completions"
        ] * 2


def test_r_gw_3_a_part_with_no_translation_is_a_400_naming_it(home: Path) -> None:
    named: Any = [{"role": "user", "content": "hello", "name": "ann"}]
    emptied: Any = [*HELLO, {"role": "assistant", "content": "hi"}, {"role": "user", "content": []}]
    no_backup = {"crossProviderFallback": False}  # only the other format could serve it
    with StandIn() as standin, gateway(home, standin, **no_backup) as gw:
        client = gw.openai()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="bolt/b1", messages=named)
        assert info.value.code == "wire_format"
        assert "`messages[0].name`" in info.value.message
        assert "ann" not in info.value.message
        with pytest.raises(anthropic.BadRequestError) as refused:
            gw.anthropic().messages.create(model="acme/a1", max_tokens=40, messages=emptied)
        assert "wire_format" in refused.value.message
        assert "`messages[2].content` (empty)" in refused.value.message
        assert standin.requests == []  # nothing sent, nothing dropped
        client.chat.completions.create(model="acme/a1", messages=named)  # its own format
        assert standin.bodies[0]["messages"] == named


def test_r_gw_3_parallel_tool_use_and_a_refusal_cross_formats(home: Path) -> None:
    tools: Any = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    refused: Any = {"role": "assistant", "content": None, "refusal": "I won't."}
    with StandIn() as standin, gateway(home, standin) as gw:
        gw.openai().chat.completions.create(
            model="bolt/b1", messages=[*HELLO, refused, *HELLO], tools=tools,
            parallel_tool_calls=False,
        )  # fmt: skip
        sent = standin.bodies[0]
        assert sent["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
        said = [{"type": "text", "text": "I won't."}]
        assert sent["messages"][1] == {"role": "assistant", "content": said}
        gw.anthropic().messages.create(
            model="acme/a1", max_tokens=40, messages=HELLO,
            tools=[{"name": "lookup", "input_schema": {"type": "object"}}],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
        )  # fmt: skip
        sent = standin.bodies[1]
        assert sent["parallel_tool_calls"] is False
        assert sent["tool_choice"] == "required"


def test_r_gw_5c_the_prompt_cache_in_a_translated_answer(home: Path) -> None:
    cached = Scripted(input_tokens=7, cache_write_tokens=40, cache_read_tokens=500)
    with StandIn(default=cached) as standin, gateway(home, standin) as gw:
        answer = gw.openai().chat.completions.create(model="bolt/b1", messages=HELLO)
        assert answer.usage is not None
        assert answer.usage.prompt_tokens == 547  # OpenAI's prompt_tokens includes the cache
        assert answer.usage.prompt_tokens_details is not None
        assert answer.usage.prompt_tokens_details.cached_tokens == 500
        message = gw.anthropic().messages.create(model="acme/a1", max_tokens=40, messages=HELLO)
        assert message.usage.input_tokens == 7  # Anthropic's leaves it out
        assert message.usage.cache_read_input_tokens == 500
        assert message.usage.cache_creation_input_tokens == 40
