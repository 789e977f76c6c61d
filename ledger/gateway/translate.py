"""Translation between the two wire formats over their common subset (R-GW-3): system, user and
assistant text; tool definitions, calls and results; stop reasons; usage; stream events.

Invariant: a request is translated only when every part of it is inside the subset
(`untranslated` is None); any other part excludes the other format's routes (`wire_format`, the
400 naming that part when no route is left), so nothing is ever dropped silently. A part is inside
only where a faithful translation exists: a message's `name`, an empty Anthropic turn and a
conversation ending on an assistant turn (a prefill in one format, a finished turn in the other)
have none. Pure functions and small stream state machines; no I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ledger.gateway.sse import Event, Malformed
from ledger.gateway.subset import _json_object, _text
from ledger.gateway.wire import Format

TO_OPENAI_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    # server tools only (outside the subset): the turn is over for this request
    "pause_turn": "stop",
}
TO_ANTHROPIC_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


# --------------------------------------------------------------------------- the common subset


# --------------------------------------------------------------------------- requests


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Consecutive turns of one role become one Anthropic message (tool results after calls)."""
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def to_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat request (inside the subset) as an Anthropic messages request."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for m in body["messages"]:
        role, content = m["role"], m.get("content")
        if role in ("system", "developer"):
            system.append(_text(content))
        elif role == "user":
            _append(messages, "user", [{"type": "text", "text": _text(content)}])
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": m["tool_call_id"],
                "content": _text(content),
            }
            _append(messages, "user", [result])
        else:
            # an assistant's refusal is its turn's text (`untranslated` keeps out a turn with both),
            # as an Anthropic refusal comes back as text to an OpenAI caller
            text = _text(content) or m.get("refusal") or ""
            blocks: list[dict[str, Any]] = []
            if text:
                blocks.append({"type": "text", "text": text})
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": fn["name"],
                        "input": _json_object(fn.get("arguments", "{}")) or {},
                    }
                )
            _append(messages, "assistant", blocks or [{"type": "text", "text": ""}])
    out: dict[str, Any] = {"model": body["model"], "messages": messages}
    if system:
        out["system"] = "\n\n".join(system)
    asked = [body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None]
    if asked:
        out["max_tokens"] = min(asked)
    for key in ("temperature", "top_p", "stream"):
        if key in body:
            out[key] = body[key]
    if "stop" in body:
        out["stop_sequences"] = [body["stop"]] if isinstance(body["stop"], str) else body["stop"]
    if "tools" in body:
        out["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "input_schema": t["function"].get("parameters") or {"type": "object"},
            }
            for t in body["tools"]
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = {"type": "tool", "name": choice["function"]["name"]}
    elif choice is not None:
        out["tool_choice"] = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    if body.get("parallel_tool_calls") is False and body.get("tools") and choice != "none":
        # one call at most; with no tools, or none allowed, there is nothing to hold back
        held = out.get("tool_choice", {"type": "auto"})
        out["tool_choice"] = {**held, "disable_parallel_tool_use": True}
    return out


def to_openai(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic messages request (inside the subset) as an OpenAI chat request."""
    messages: list[dict[str, Any]] = []
    if "system" in body and _text(body["system"]):
        messages.append({"role": "system", "content": _text(body["system"])})
    for m in body["messages"]:
        content = m["content"]
        if isinstance(content, str):
            messages.append({"role": m["role"], "content": content})
            continue
        texts = [b["text"] for b in content if b["type"] == "text"]
        if m["role"] == "user":
            for b in content:
                if b["type"] == "tool_result":
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": b["tool_use_id"],
                            "content": _text(b.get("content", "")),
                        }
                    )
            if texts:
                messages.append({"role": "user", "content": "".join(texts)})
            continue
        calls = [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}))},
            }
            for b in content
            if b["type"] == "tool_use"
        ]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            message["tool_calls"] = calls
        messages.append(message)
    out: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        "max_tokens": body["max_tokens"],
    }
    for key in ("temperature", "top_p", "stream"):
        if key in body:
            out[key] = body[key]
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    if "tools" in body:
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema") or {"type": "object"},
                },
            }
            for t in body["tools"]
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice["type"]
        out["tool_choice"] = (
            {"type": "function", "function": {"name": choice["name"]}}
            if kind == "tool"
            else {"auto": "auto", "any": "required", "none": "none"}[kind]
        )
        if choice.get("disable_parallel_tool_use") is True and body.get("tools") and kind != "none":
            out["parallel_tool_calls"] = False
    return out


def request_for(caller: Format, route: Format, body: dict[str, Any]) -> dict[str, Any]:
    """The caller's body in the route's format (unchanged when they are the same)."""
    if caller is route:
        return body
    return to_anthropic(body) if route is Format.ANTHROPIC else to_openai(body)


# --------------------------------------------------------------------------- replies


def reply_for(caller: Format, route: Format, document: dict[str, Any]) -> dict[str, Any]:
    """The route's answer in the caller's format (Malformed when it cannot be read)."""
    if caller is route:
        return document
    try:
        if caller is Format.OPENAI:
            return _completion_of(document)
        return _message_of(document)
    except (KeyError, TypeError, AttributeError, IndexError):
        raise Malformed from None


def _completion_of(doc: dict[str, Any]) -> dict[str, Any]:
    text = "".join(b["text"] for b in doc["content"] if b.get("type") == "text")
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}))},
        }
        for b in doc["content"]
        if b.get("type") == "tool_use"
    ]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if text or not calls else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    usage = doc.get("usage") or {}
    return {
        "id": str(doc.get("id", "msg")),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": doc.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": TO_OPENAI_FINISH.get(doc.get("stop_reason") or "", "stop"),
            }
        ],
        "usage": openai_usage(
            _tokens(usage.get("input_tokens")),
            _tokens(usage.get("cache_creation_input_tokens")),
            _tokens(usage.get("cache_read_input_tokens")),
            _tokens(usage.get("output_tokens")),
        ),
    }


def _tokens(value: object) -> int:
    """A token count from a reply's usage (anything but a count is none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def openai_usage(uncached: int, written: int, read: int, completion: int) -> dict[str, Any]:
    """OpenAI's usage for Anthropic's counts: `prompt_tokens` includes the cached tokens, and
    `prompt_tokens_details` says how many were read from the cache (`cached_tokens`) and, when
    any, written to it (`cache_write_tokens`, as the ledger reads an OpenAI-format reply)."""
    prompt = uncached + written + read
    details = {"cached_tokens": read}
    if written:
        details["cache_write_tokens"] = written
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
    }


def anthropic_usage(usage: dict[str, Any]) -> dict[str, int]:
    """Anthropic's usage for OpenAI's: `input_tokens` leaves out the cached tokens (read, and
    written where the provider says so)."""
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    read = _tokens(details.get("cached_tokens"))
    written = _tokens(details.get("cache_write_tokens"))
    return {
        "input_tokens": max(0, _tokens(usage.get("prompt_tokens")) - read - written),
        "output_tokens": _tokens(usage.get("completion_tokens")),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }


def _message_of(doc: dict[str, Any]) -> dict[str, Any]:
    choice = doc["choices"][0]
    message = choice["message"]
    stop = TO_ANTHROPIC_STOP.get(choice.get("finish_reason") or "", "end_turn")
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    elif message.get("refusal"):  # OpenAI's refusal is its own field; Anthropic's is text
        content.append({"type": "text", "text": message["refusal"]})
        stop = "refusal"
    for call in message.get("tool_calls") or []:
        arguments = _json_object(call["function"].get("arguments", "{}"))
        if arguments is None:
            raise Malformed
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": arguments,
            }
        )
    return {
        "id": str(doc.get("id", "msg")),
        "type": "message",
        "role": "assistant",
        "model": doc.get("model", ""),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": anthropic_usage(doc.get("usage") or {}),
    }


# --------------------------------------------------------------------------- streams


def _sse(data: Any, name: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return ((f"event: {name}\n" if name else "") + f"data: {text}\n\n").encode()


@dataclass
class OpenAIFromAnthropic:
    """An Anthropic event stream as chat.completion.chunk events for an OpenAI caller."""

    model: str
    tools: dict[int, int] = field(default_factory=dict)  # Anthropic block index -> tool index
    # Anthropic's prompt counts (message_start's, updated by message_delta's when it has them)
    prompt: dict[str, int] = field(default_factory=dict)
    done: bool = False
    usage: bool = True  # the caller asked for the usage chunk (`stream_options.include_usage`)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse(
            {
                "id": "chatcmpl-ledger",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )

    def _count(self, usage: dict[str, Any]) -> None:
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            if usage.get(key) is not None:
                self.prompt[key] = _tokens(usage[key])

    def feed(self, event: Event) -> Iterable[bytes]:
        """The caller's events for one upstream event."""
        data = event.data or {}
        kind = data.get("type")
        if kind == "message_start":
            self._count((data.get("message") or {}).get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") != "tool_use":
                return []
            index = self.tools.setdefault(data.get("index", 0), len(self.tools))
            call = {
                "index": index,
                "id": block.get("id"),
                "type": "function",
                "function": {"name": block.get("name"), "arguments": ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                return [self._chunk({"content": delta.get("text", "")})]
            if delta.get("type") == "input_json_delta":
                index = self.tools.get(data.get("index", 0), 0)
                call = {"index": index, "function": {"arguments": delta.get("partial_json", "")}}
                return [self._chunk({"tool_calls": [call]})]
            return []
        if kind == "message_delta":
            stop = (data.get("delta") or {}).get("stop_reason") or ""
            delta_usage = data.get("usage") or {}
            self._count(delta_usage)
            usage = openai_usage(
                self.prompt.get("input_tokens", 0),
                self.prompt.get("cache_creation_input_tokens", 0),
                self.prompt.get("cache_read_input_tokens", 0),
                _tokens(delta_usage.get("output_tokens")),
            )
            finish = self._chunk({}, TO_OPENAI_FINISH.get(stop, "stop"))
            if not self.usage:
                return [finish]
            return [
                finish,
                _sse(
                    {
                        "id": "chatcmpl-ledger",
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": self.model,
                        "choices": [],
                        "usage": usage,
                    }
                ),
            ]
        if kind == "message_stop":
            self.done = True
            return [_sse("[DONE]")]
        return []

    def finish(self) -> Iterable[bytes]:
        """The terminator, when the upstream ended complete without its own."""
        if self.done:
            return []
        self.done = True
        return [_sse("[DONE]")]


@dataclass
class AnthropicFromOpenAI:
    """An OpenAI chunk stream as Anthropic message events for an Anthropic caller."""

    model: str
    started: bool = False
    block: int = -1
    block_kind: str | None = None
    tools: dict[int, int] = field(default_factory=dict)  # OpenAI tool index -> block index
    stop: str | None = None
    refused: bool = False  # OpenAI's `refusal` came (its own field; Anthropic's is text)
    answered: bool = False  # content came: a refusal with it is not the turn's stop reason
    usage: dict[str, int] = field(default_factory=dict)
    done: bool = False

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {
            "id": "msg_ledger",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [_sse({"type": "message_start", "message": message}, "message_start")]

    def _close_block(self) -> list[bytes]:
        if self.block_kind is None:
            return []
        self.block_kind = None
        return [_sse({"type": "content_block_stop", "index": self.block}, "content_block_stop")]

    def _open(self, block: dict[str, Any], kind: str) -> list[bytes]:
        out = self._close_block()
        self.block += 1
        self.block_kind = kind
        start = {"type": "content_block_start", "index": self.block, "content_block": block}
        return [*out, _sse(start, "content_block_start")]

    def feed(self, event: Event) -> Iterable[bytes]:
        """The caller's events for one upstream event."""
        if event.done:
            return self.finish()
        out = self._start()
        data = event.data or {}
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.usage = anthropic_usage(usage)
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            self.refused = self.refused or bool(delta.get("refusal"))
            self.answered = self.answered or bool(delta.get("content"))
            text = delta.get("content") or delta.get("refusal")
            if text:
                if self.block_kind != "text":
                    out += self._open({"type": "text", "text": ""}, "text")
                out.append(
                    _sse(
                        {
                            "type": "content_block_delta",
                            "index": self.block,
                            "delta": {"type": "text_delta", "text": text},
                        },
                        "content_block_delta",
                    )
                )
            for call in delta.get("tool_calls") or []:
                index = call.get("index", 0)
                fn = call.get("function") or {}
                if index not in self.tools:
                    block = {
                        "type": "tool_use",
                        "id": call.get("id") or f"call_{index}",
                        "name": fn.get("name", ""),
                        "input": {},
                    }
                    out += self._open(block, "tool_use")
                    self.tools[index] = self.block
                if fn.get("arguments"):
                    out.append(
                        _sse(
                            {
                                "type": "content_block_delta",
                                "index": self.tools[index],
                                "delta": {
                                    "type": "input_json_delta",
                                    "partial_json": fn["arguments"],
                                },
                            },
                            "content_block_delta",
                        )
                    )
            if isinstance(choice.get("finish_reason"), str):
                stop = TO_ANTHROPIC_STOP.get(choice["finish_reason"], "end_turn")
                self.stop = "refusal" if self.refused and not self.answered else stop
                out += self._close_block()
        return out

    def finish(self) -> list[bytes]:
        """message_delta (stop reason, usage) and message_stop, once."""
        if self.done:
            return []
        self.done = True
        out = [*self._start(), *self._close_block()]
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self.stop or "end_turn", "stop_sequence": None},
            "usage": {
                "output_tokens": self.usage.get("output_tokens", 0),
                "input_tokens": self.usage.get("input_tokens", 0),
                "cache_creation_input_tokens": self.usage.get("cache_creation_input_tokens", 0),
                "cache_read_input_tokens": self.usage.get("cache_read_input_tokens", 0),
            },
        }
        out.append(_sse(delta, "message_delta"))
        out.append(_sse({"type": "message_stop"}, "message_stop"))
        return out


def stream_translator(
    caller: Format, route: Format, model: str, usage: bool = True
) -> OpenAIFromAnthropic | AnthropicFromOpenAI | None:
    """The stream translator for a route of the other format (None for the same one); `usage`:
    an OpenAI caller asked for the usage chunk."""
    if caller is route:
        return None
    if caller is Format.OPENAI:
        return OpenAIFromAnthropic(model, usage=usage)
    return AnthropicFromOpenAI(model)
