"""OpenAI chat completions as a wire format (R-GW-1, R-FMT-1): `POST /openai/v1/chat/completions`
and `GET /openai/v1/models`; the `openai-chat` providers' requests, replies and streams."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger.catalog import Model
from ledger.gateway.formats import internal as i
from ledger.gateway.formats.base import Limits, RouteParts, WireFormat
from ledger.gateway.formats.common import (
    chat_problem,
    choices_of,
    clamp,
    is_str,
    json_object,
    smaller,
    sse,
    text_of,
    text_parts,
    tokens,
    top_level,
    trailing_assistant,
)
from ledger.gateway.sse import DONE, Event, Malformed, Tracker
from ledger.providers import openai_chat as provider
from ledger.providers.base import CallRequest, HttpAdapter, ProviderResponse
from ledger.providers.bounded import JsonReply
from ledger.routing.effort import openai_fields
from ledger.targets import Effort

ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}
MAX_CHOICES = 128
"""The most choices (`n`) a request may ask for (OpenAI's own bound). Each choice is capped at the
reply allowance divided by `n`, so all of them together stay inside the estimate the reservation
made; a route whose allowance is smaller than `n` cannot serve the request."""

KEYS = frozenset(
    {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
        "stop", "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls",
    }
)  # fmt: skip
NAMED = frozenset(
    {
        "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "metadata", "modalities", "n", "prediction", "presence_penalty", "prompt_cache_key",
        "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier",
        "store", "top_logprobs", "user", "verbosity", "web_search_options",
    }
)  # fmt: skip
"""The documented fields outside the subset, which a 400 may name."""
PARAMS = ("temperature", "top_p", "stream")

FROM_FINISH: Mapping[str, i.Stop] = {
    "stop": i.END,
    "length": i.LENGTH,
    "tool_calls": i.TOOL,
    "function_call": i.TOOL,
    "content_filter": i.REFUSAL,
}
TO_FINISH: Mapping[i.Stop, str] = {
    i.END: "stop",
    i.LENGTH: "length",
    i.TOOL: "tool_calls",
    i.REFUSAL: "content_filter",
}
TO_CHOICE = {"auto": "auto", "required": "required", "none": "none"}


def usage_only(event_data: object) -> bool:
    """A chunk carrying usage and no choice (the one `include_usage` adds)."""
    return (
        isinstance(event_data, dict)
        and event_data.get("choices") == []
        and event_data.get("usage") is not None
    )


def openai_usage(usage: i.Usage) -> dict[str, Any]:
    """The usage object: `prompt_tokens` includes the cached tokens, and
    `prompt_tokens_details` says how many were read from the cache (`cached_tokens`) and, when
    any, written to it (`cache_write_tokens`, as the ledger reads a reply of this format)."""
    prompt = usage.input + usage.cache_write + usage.cache_read
    details = {"cached_tokens": usage.cache_read}
    if usage.cache_write:
        details["cache_write_tokens"] = usage.cache_write
    return {
        "prompt_tokens": prompt,
        "completion_tokens": usage.output,
        "total_tokens": prompt + usage.output,
        "prompt_tokens_details": details,
    }


def internal_usage(usage: dict[str, Any]) -> i.Usage:
    """The counts of a usage object; the input leaves out the cached tokens."""
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    read = tokens(details.get("cached_tokens"))
    written = tokens(details.get("cache_write_tokens"))
    return i.Usage(
        input=max(0, tokens(usage.get("prompt_tokens")) - read - written),
        cache_write=written,
        cache_read=read,
        output=tokens(usage.get("completion_tokens")),
    )


class OpenAIChat(WireFormat):
    name = "openai-chat"
    prefix = "/openai/"
    path = "/openai/v1/chat/completions"
    models_path = "/openai/v1/models"

    # ----------------------------------------------------------------- the caller's side

    def check(self, body: object) -> str | None:
        problem = chat_problem(body, ("max_tokens", "max_completion_tokens"))
        if problem is not None:
            return problem
        assert isinstance(body, dict)
        choices = body.get("n")
        if choices is not None and not (
            isinstance(choices, int)
            and not isinstance(choices, bool)
            and 1 <= choices <= MAX_CHOICES
        ):
            return f"`n` must be an integer from 1 to {MAX_CHOICES}"
        return None

    def outside(self, body: dict[str, Any]) -> str | None:
        return _outside(body)

    def error_document(self, status: int, code: str, message: str) -> dict[str, Any]:
        other = "server_error" if status >= 500 else "invalid_request_error"
        kind = ERROR_TYPES.get(status, other)
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    def wants_usage(self, body: Mapping[str, Any]) -> bool:
        """Only with `stream_options.include_usage` (the gateway always asks upstream, to settle
        the stream, and shows the usage-only chunk only to a caller who asked)."""
        options = body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def usage_only(self, data: object) -> bool:
        return usage_only(data)

    def with_model(self, data: dict[str, Any], model_key: str) -> dict[str, Any]:
        if "model" in data:
            data["model"] = model_key
        return data

    def fits_allowance(self, body: Mapping[str, Any], allowance: int) -> bool:
        """Each of the `n` choices gets a token."""
        return allowance // choices_of(body) >= 1

    def models_document(self, models: list[tuple[str, str, str]]) -> dict[str, Any]:
        """(model key, owner, kind) triples as OpenAI model objects, each with its `kind`
        (`chat` or `embedding`, R-FMT-3)."""
        data = [
            {"id": k, "object": "model", "created": 0, "owned_by": o, "kind": kind}
            for k, o, kind in models
        ]
        return {"object": "list", "data": data}

    # ----------------------------------------------------------------- the internal form

    def to_internal(self, body: dict[str, Any]) -> i.Request:
        system: list[str] = []
        messages: list[i.Message] = []
        for m in body["messages"]:
            role, content = m["role"], m.get("content")
            if role in ("system", "developer"):
                system.append(text_of(content))
            elif role == "user":
                messages.append(i.Message("user", (i.Text(text_of(content)),)))
            elif role == "tool":
                result = i.ToolResult(m["tool_call_id"], text_of(content))
                messages.append(i.Message("user", (result,)))
            else:
                # an assistant's refusal is its turn's text (`outside` keeps out a turn with
                # both), as a refusal of another format comes back as text to this one's caller
                text = text_of(content) or m.get("refusal") or ""
                parts: list[i.Part] = [i.Text(text)] if text else []
                for call in m.get("tool_calls") or []:
                    fn = call["function"]
                    arguments = json_object(fn.get("arguments", "{}")) or {}
                    parts.append(i.ToolCall(call["id"], fn["name"], arguments))
                messages.append(i.Message("assistant", tuple(parts)))
        names = ("max_completion_tokens", "max_tokens")
        asked = [body[k] for k in names if body.get(k) is not None]
        stop = body.get("stop")
        tools = None
        if "tools" in body:
            tools = tuple(
                i.Tool(
                    t["function"]["name"],
                    t["function"].get("description", ""),
                    t["function"].get("parameters") or {"type": "object"},
                )
                for t in body["tools"]
            )
        choice = body.get("tool_choice")
        tool_choice = None
        if isinstance(choice, dict):
            tool_choice = i.ToolChoice("tool", choice["function"]["name"])
        elif choice is not None:
            tool_choice = i.ToolChoice(choice)
        return i.Request(
            model=body["model"],
            messages=tuple(messages),
            system="\n\n".join(system) if system else None,
            max_tokens=min(asked) if asked else None,
            params={k: body[k] for k in PARAMS if k in body},
            stop=None if "stop" not in body else [stop] if isinstance(stop, str) else stop,
            tools=tools,
            tool_choice=tool_choice,
            # one call at most; with no tools, or none allowed, there is nothing to hold back
            one_call=body.get("parallel_tool_calls") is False
            and bool(body.get("tools"))
            and choice != "none",
        )

    def from_internal(self, request: i.Request) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        for m in request.messages:
            texts = [p.text for p in m.parts if isinstance(p, i.Text)]
            if m.role == "user":
                for p in m.parts:
                    if isinstance(p, i.ToolResult):
                        messages.append({"role": "tool", "tool_call_id": p.id, "content": p.text})
                if texts:
                    messages.append({"role": "user", "content": "".join(texts)})
                continue
            calls = [_call(p) for p in m.parts if isinstance(p, i.ToolCall)]
            message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
        out: dict[str, Any] = {
            "model": request.model,
            "messages": messages,
            "max_tokens": request.max_tokens,
        }
        out.update(request.params)
        if request.effort is not None:  # an Anthropic caller's thinking (R-FMT-4)
            out["reasoning_effort"] = request.effort
        if request.stop is not None:
            out["stop"] = request.stop
        if request.tools is not None:
            out["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.schema,
                    },
                }
                for t in request.tools
            ]
        choice = request.tool_choice
        if choice is not None:
            out["tool_choice"] = (
                {"type": "function", "function": {"name": choice.name}}
                if choice.kind == "tool"
                else TO_CHOICE[choice.kind]
            )
            if request.one_call:
                out["parallel_tool_calls"] = False
        return out

    def answer_to_internal(self, document: dict[str, Any]) -> i.Answer:
        choice = document["choices"][0]
        message = choice["message"]
        stop = FROM_FINISH.get(choice.get("finish_reason") or "", i.END)
        parts: list[i.Text | i.ToolCall] = []
        if message.get("content"):
            parts.append(i.Text(message["content"]))
        elif message.get("refusal"):  # its own field here; another format's refusal is text
            parts.append(i.Text(message["refusal"]))
            stop = i.REFUSAL
        for call in message.get("tool_calls") or []:
            arguments = json_object(call["function"].get("arguments", "{}"))
            if arguments is None:
                raise Malformed
            parts.append(i.ToolCall(call["id"], call["function"]["name"], arguments))
        return i.Answer(
            id=str(document.get("id", "msg")),
            model=document.get("model", ""),
            parts=tuple(parts),
            stop=stop,
            usage=internal_usage(document.get("usage") or {}),
        )

    def answer_from_internal(self, answer: i.Answer) -> dict[str, Any]:
        text = "".join(p.text for p in answer.parts if isinstance(p, i.Text))
        calls = [_call(p) for p in answer.parts if isinstance(p, i.ToolCall)]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text if text or not calls else None,
            "refusal": None,
        }
        if calls:
            message["tool_calls"] = calls
        return {
            "id": answer.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": answer.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": TO_FINISH[answer.stop],
                }
            ],
            "usage": openai_usage(answer.usage),
        }

    def stream_reader(self) -> Reader:
        return Reader()

    def stream_writer(self, model: str, usage: bool) -> Writer:
        return Writer(model, usage=usage)

    # ----------------------------------------------------------------- the provider's side

    def upstream_route(self, adapter: HttpAdapter, model: Model, allowance: int) -> RouteParts:
        url = f"{adapter.base_url()}/chat/completions"
        # the field's name depends on the URL and the reasoning flag alone (no deadline here)
        probe = CallRequest(model.id, (), allowance, 0, bool(model.reasoning))
        return RouteParts(url, {}, provider.max_tokens_field(probe, url))

    def credential_header(self, credential: str) -> tuple[str, str]:
        return "authorization", f"Bearer {credential}"

    def upstream_body(self, body: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
        """The max-tokens field set or clamped to each choice's share of the allowance, and
        `stream_options.include_usage` on streams."""
        out = dict(body)
        out["model"] = limits.upstream_id
        asked = None
        for name in ("max_completion_tokens", "max_tokens"):
            if name in out:
                asked = smaller(asked, out.pop(name))
        # `n` choices share the one reply allowance the reservation's estimate covers: the
        # field caps each choice, so each gets an equal part (`fits_allowance`: one at least)
        share = max(1, limits.max_tokens // choices_of(body))
        out[limits.max_tokens_field] = clamp(asked, share)
        if body.get("stream") is True:
            options = body.get("stream_options")
            options = dict(options) if isinstance(options, dict) else {}
            options["include_usage"] = True
            out["stream_options"] = options
        return out

    def effort_fields(self, level: Effort, body: Mapping[str, Any]) -> Mapping[str, Any]:
        return openai_fields(level)

    def parse_reply(self, reply: JsonReply) -> ProviderResponse:
        return provider.parse_chat_completion(reply)

    def observe(self, tracker: Tracker, event: Event) -> None:
        if event.done:
            tracker.terminated = True
            return
        data = event.data
        if "error" in data:
            tracker.error = True
            return
        choices = data.get("choices")
        if not isinstance(choices, list):
            raise Malformed
        for choice in choices:
            if not isinstance(choice, dict):
                raise Malformed
            delta = choice.get("delta")
            # content is any output in the delta: text, tool calls, a refusal, and what
            # OpenAI-compatible reasoning models stream first (`reasoning_content`,
            # `reasoning`), which must not wait behind firstTokenMs; a role alone is none
            if isinstance(delta, dict) and any(v for k, v in delta.items() if k != "role"):
                tracker.content = True
            if isinstance(choice.get("finish_reason"), str):
                tracker.finish = choice["finish_reason"]
                tracker.content = True
        usage = data.get("usage")
        if isinstance(usage, dict):  # read as a whole answer's is (R-GW-5c)
            counts = provider.usage_counts(usage)
            tracker.input_tokens, tracker.output_tokens = counts.input_tokens, counts.output_tokens
            tracker.cache_write_tokens = counts.cache_write_tokens
            tracker.cache_read_tokens = counts.cache_read_tokens


def _call(call: i.ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.input)},
    }


# --------------------------------------------------------------------------- streams


@dataclass
class Reader:
    """chat.completion.chunk events as internal events."""

    started: bool = False
    calls: set[Any] = field(default_factory=set)  # the tool indices begun
    refused: bool = False  # a `refusal` came (its own field here; text elsewhere)
    answered: bool = False  # content came: a refusal with it is not the turn's stop reason

    def read(self, event: Event) -> list[i.StreamEvent]:
        if event.done:
            return [i.End()]
        out: list[i.StreamEvent] = []
        if not self.started:
            self.started = True
            out.append(i.Start())
        data = event.data or {}
        usage = data.get("usage")
        if isinstance(usage, dict):
            out.append(i.UsageSeen(internal_usage(usage)))
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            self.refused = self.refused or bool(delta.get("refusal"))
            self.answered = self.answered or bool(delta.get("content"))
            text = delta.get("content") or delta.get("refusal")
            if text:
                out.append(i.TextDelta(text))
            for call in delta.get("tool_calls") or []:
                index = call.get("index", 0)
                fn = call.get("function") or {}
                if index not in self.calls:
                    self.calls.add(index)
                    name = fn.get("name", "")
                    out.append(i.ToolStart(index, call.get("id") or f"call_{index}", name))
                if fn.get("arguments"):
                    out.append(i.ToolArgs(index, fn["arguments"]))
            if isinstance(choice.get("finish_reason"), str):
                stop = FROM_FINISH.get(choice["finish_reason"], i.END)
                out.append(i.Stopped(i.REFUSAL if self.refused and not self.answered else stop))
        return out


@dataclass
class Writer:
    """Internal events as chat.completion.chunk events."""

    model: str
    tools: dict[Any, int] = field(default_factory=dict)  # source key -> tool index
    done: bool = False
    usage: bool = True  # the caller asked for the usage chunk (`stream_options.include_usage`)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse({"id": "chatcmpl-ledger", "object": "chat.completion.chunk",
                    "created": int(time.time()), "model": self.model,
                    "choices": [choice]})  # fmt: skip

    def write(self, event: i.StreamEvent) -> list[bytes]:
        if isinstance(event, i.TextDelta):
            return [self._chunk({"content": event.text})]
        if isinstance(event, i.ToolArgs):
            call = {"index": self.tools.get(event.key, 0), "function": {"arguments": event.text}}
            return [self._chunk({"tool_calls": [call]})]
        if isinstance(event, i.Start):
            return [self._chunk({"role": "assistant", "content": ""})]
        if isinstance(event, i.ToolStart):
            index = self.tools.setdefault(event.key, len(self.tools))
            call = {"index": index, "id": event.id, "type": "function",
                    "function": {"name": event.name, "arguments": ""}}  # fmt: skip
            return [self._chunk({"tool_calls": [call]})]
        if isinstance(event, i.Stopped):
            return [self._chunk({}, TO_FINISH[event.reason])]
        if isinstance(event, i.UsageSeen):
            if not self.usage:
                return []
            return [sse({"id": "chatcmpl-ledger", "object": "chat.completion.chunk",
                         "created": int(time.time()), "model": self.model, "choices": [],
                         "usage": openai_usage(event.usage)})]  # fmt: skip
        self.done = True  # End
        return [sse(DONE)]

    def finish(self) -> list[bytes]:
        if self.done:
            return []
        self.done = True
        return [sse(DONE)]


# --------------------------------------------------------------------------- the subset


def _message_outside(m: dict[str, Any]) -> str | None:
    """What of one message has no internal form (`.field`), or None. A key whose value is
    null says nothing and is left out."""
    given = {k for k, v in m.items() if v is not None}
    role = m.get("role")
    if role in ("system", "developer", "user"):
        allowed = {"role", "content"}  # no per-message `name` in the internal form
    elif role == "tool":
        allowed = {"role", "content", "tool_call_id"}
        if not is_str(m.get("tool_call_id")):
            return ".tool_call_id"
    elif role == "assistant":
        allowed = {"role", "content", "tool_calls", "refusal"}
    else:
        return ".role"
    extra = sorted(given - allowed)
    if extra:
        return f".{extra[0]}" if extra[0] in ("name", "audio", "function_call") else ""
    content = m.get("content")
    if role == "assistant":
        if content is not None and not text_parts(content):
            return ".content"
        refusal = m.get("refusal")
        if refusal is not None and not is_str(refusal):
            return ".refusal"
        if refusal and text_of(content):  # one turn's text: the answer or the refusal
            return ".refusal"
        calls = m.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(map(_call_ok, calls))):
            return ".tool_calls"
        return None
    return None if text_parts(content) else ".content"


def _call_ok(call: object) -> bool:
    if not isinstance(call, dict) or call.get("type", "function") != "function":
        return False
    if not set(call) <= {"id", "type", "function"}:
        return False
    fn = call.get("function")
    if not is_str(call.get("id")) or not isinstance(fn, dict) or not is_str(fn.get("name")):
        return False
    return set(fn) <= {"name", "arguments"} and json_object(fn.get("arguments", "{}")) is not None


def _tools_ok(tools: object) -> bool:
    return isinstance(tools, list) and all(
        isinstance(t, dict)
        and set(t) <= {"type", "function"}
        and t.get("type") == "function"
        and isinstance(t.get("function"), dict)
        and is_str(t["function"].get("name"))
        and set(t["function"]) <= {"name", "description", "parameters"}
        for t in tools
    )


def _choice_ok(choice: object) -> bool:
    if choice is None or choice in ("auto", "none", "required"):
        return True
    if not isinstance(choice, dict) or set(choice) != {"type", "function"}:
        return False
    fn = choice["function"]
    return (
        choice["type"] == "function"
        and isinstance(fn, dict)
        and set(fn) == {"name"}
        and is_str(fn["name"])
    )


def _outside(body: dict[str, Any]) -> str | None:
    named = top_level(body, KEYS, NAMED)
    if named is not None:
        return named
    stop = body.get("stop")
    if "stop" in body and not (is_str(stop) or (isinstance(stop, list) and all(map(is_str, stop)))):
        return "`stop`"
    options = body.get("stream_options")
    if options is not None and not (
        isinstance(options, dict) and set(options) <= {"include_usage"}
    ):
        return "`stream_options`"
    if not isinstance(body.get("parallel_tool_calls", False), bool):
        return "`parallel_tool_calls`"
    if "tools" in body and not _tools_ok(body["tools"]):
        return "`tools`"
    if not _choice_ok(body.get("tool_choice")):
        return "`tool_choice`"
    began = False  # a system message after the first turn would move to the top: outside
    for index, m in enumerate(body["messages"]):
        field_ = _message_outside(m)
        if field_ is not None:
            return f"`messages[{index}]{field_}`"
        if m["role"] not in ("system", "developer"):
            began = True
        elif began:
            return f"`messages[{index}].role` (a system message after the first turn)"
    return trailing_assistant(body["messages"])


FORMAT = OpenAIChat()
