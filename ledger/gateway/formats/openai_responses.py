"""The OpenAI Responses API as a wire format (R-FMT-1, R-FMT-2): `POST /openai/v1/responses`;
the `openai-responses` providers' requests, replies and streams (the stream's typed events are in
`openai_responses_stream`).

Served by a native Responses route as sent (model and `max_output_tokens` set, R-GW-3), and by
OpenAI chat and Anthropic routes through the internal form when the request is stateless
(`store: false`, no `previous_response_id`) and inside the common subset (instructions, input
messages, text, function tools and their calls and results, reasoning effort, max output tokens).

A translation leaves out only the documented hints in `DROPPED` (each reported on the answer in
`x-ledger-dropped`): what a chat or messages route has no use for and that does not change the
answer's meaning (a prompt-cache key, client metadata, `include`, a reasoning summary, encrypted
reasoning items, hosted and namespaced tools the route cannot run).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

from ledger.catalog import Model
from ledger.gateway.formats import internal as i
from ledger.gateway.formats.base import Limits, RouteParts, WireFormat
from ledger.gateway.formats.common import clamp, is_str, json_object, smaller, top_level
from ledger.gateway.formats.openai_chat import ERROR_TYPES
from ledger.gateway.formats.openai_responses_stream import (
    FROM_STOP,
    Reader,
    Writer,
    call_item,
    message_item,
    observe,
    response_object,
)
from ledger.gateway.sse import Event, Malformed, Tracker
from ledger.providers import openai_responses as provider
from ledger.providers.base import HttpAdapter, ProviderResponse
from ledger.providers.bounded import JsonReply
from ledger.routing.effort import OPENAI_REASONING_EFFORT
from ledger.targets import Effort

KEYS = frozenset(
    {
        "model", "input", "instructions", "max_output_tokens", "temperature", "top_p",
        "stream", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "store", "text",
        # hints a translation drops (DROPPED)
        "include", "prompt_cache_key", "client_metadata",
    }
)  # fmt: skip
NAMED = frozenset(
    {
        "background", "conversation", "max_tool_calls", "metadata", "previous_response_id",
        "prompt", "safety_identifier", "service_tier", "stream_options", "top_logprobs",
        "truncation", "user",
    }
)  # fmt: skip
"""The documented fields outside the subset, which a 400 may name."""
PARAMS = ("temperature", "top_p", "stream")
DROPPED = (
    "include", "prompt_cache_key", "client_metadata", "reasoning.summary", "reasoning-items",
    "hosted-tools",
)  # fmt: skip
"""What a translation to another format leaves out, as `x-ledger-dropped` names it."""
EFFORTS: Mapping[str, Effort] = {e.value: e for e in Effort}
TO_EFFORT: Mapping[Effort, str] = {Effort.NONE: "none", **OPENAI_REASONING_EFFORT}


def new_id(prefix: str) -> str:
    """An id of the API's shape (`resp_…`, `msg_…`, `fc_…`) for an answer the gateway writes."""
    return f"{prefix}_ledger{secrets.token_hex(12)}"


class OpenAIResponses(WireFormat):
    name = "openai-responses"
    prefix = "/openai/v1/responses"
    path = "/openai/v1/responses"
    error_event = "error"

    # ----------------------------------------------------------------- the caller's side

    def check(self, body: object) -> str | None:
        if not isinstance(body, dict):
            return "the body must be a JSON object"
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "`model` must be a non-empty string"
        given = body.get("input")
        if not (is_str(given) or (isinstance(given, list) and all(map(_is_dict, given)))):
            return "`input` must be a string or a list of objects"
        for name in ("stream", "store", "parallel_tool_calls"):
            if body.get(name) is not None and not isinstance(body[name], bool):
                return f"`{name}` must be true or false"
        count = body.get("max_output_tokens")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)
                                  or count <= 0):  # fmt: skip
            return "`max_output_tokens` must be a positive integer"
        for name in ("instructions", "previous_response_id"):
            if body.get(name) is not None and not is_str(body[name]):
                return f"`{name}` must be a string"
        return None

    def outside(self, body: dict[str, Any]) -> str | None:
        return _outside(body)

    def error_document(self, status: int, code: str, message: str) -> dict[str, Any]:
        other = "server_error" if status >= 500 else "invalid_request_error"
        kind = ERROR_TYPES.get(status, other)
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    def stream_error_event(self, status: int, code: str, message: str) -> bytes:
        """The Responses stream's `error` event (its own shape: no `error` wrapper)."""
        data = {"type": "error", "code": code, "message": message, "param": None,
                "sequence_number": 0}  # fmt: skip
        return f"event: error\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    def with_model(self, data: dict[str, Any], model_key: str) -> dict[str, Any]:
        response = data.get("response")
        if isinstance(response, dict) and "model" in response:
            data["response"] = {**response, "model": model_key}
        return data

    def stores(self, body: Mapping[str, Any]) -> bool:
        """`store` true or omitted (the API's default): the answer is kept by its provider."""
        return body.get("store") is not False

    def previous(self, body: Mapping[str, Any]) -> str | None:
        """The stored response a request continues (R-FMT-2: pinned to its provider)."""
        value = body.get("previous_response_id")
        return value if isinstance(value, str) and value else None

    def requested_effort(self, body: Mapping[str, Any]) -> str | None:
        """The caller's `reasoning.effort` as a route effort level (R-RT-2), for another
        format's route; None when not given."""
        reasoning = body.get("reasoning")
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
        return EFFORTS[effort].value if isinstance(effort, str) and effort in EFFORTS else None

    def dropped(self, body: Mapping[str, Any]) -> tuple[str, ...]:
        """The documented hints a translation of this body leaves out (DROPPED)."""
        out = [k for k in ("include", "prompt_cache_key", "client_metadata") if k in body]
        reasoning = body.get("reasoning")
        if isinstance(reasoning, dict) and reasoning.get("summary") is not None:
            out.append("reasoning.summary")
        items = body.get("input")
        if isinstance(items, list) and any(_kind(m) == "reasoning" for m in items):
            out.append("reasoning-items")
        if any(not _function_tool(t) for t in body.get("tools") or []):
            out.append("hosted-tools")
        return tuple(out)

    # ----------------------------------------------------------------- the internal form

    def to_internal(self, body: dict[str, Any]) -> i.Request:
        system: list[str] = []
        if body.get("instructions"):
            system.append(body["instructions"])
        messages: list[i.Message] = []
        items = body["input"]
        for item in [{"role": "user", "content": items}] if is_str(items) else items:
            kind = _kind(item)
            if kind == "reasoning":
                continue  # an encrypted item is for the provider that wrote it (DROPPED)
            if kind == "function_call":
                arguments = json_object(item.get("arguments", "{}")) or {}
                _add(messages, "assistant", i.ToolCall(item["call_id"], item["name"], arguments))
            elif kind == "function_call_output":
                _add(messages, "user", i.ToolResult(item["call_id"], _output_text(item)))
            elif item["role"] in ("system", "developer"):
                system.append(_text(item.get("content")))
            else:
                _add(messages, item["role"], i.Text(_text(item.get("content"))))
        tools = None
        if "tools" in body:
            tools = tuple(
                i.Tool(t["name"], t.get("description") or "",
                       t.get("parameters") or {"type": "object"})
                for t in body["tools"] if _function_tool(t)
            )  # fmt: skip
        choice = body.get("tool_choice")
        tool_choice = None
        if isinstance(choice, dict):
            tool_choice = i.ToolChoice("tool", choice["name"])
        elif choice is not None:
            tool_choice = i.ToolChoice(choice)
        return i.Request(
            model=body["model"],
            messages=tuple(messages),
            system="\n\n".join(system) if system else None,
            max_tokens=body.get("max_output_tokens"),
            params={k: body[k] for k in PARAMS if k in body},
            tools=tools or None,
            tool_choice=tool_choice if tools else None,
            one_call=body.get("parallel_tool_calls") is False and bool(tools)
            and choice != "none",
        )

    def from_internal(self, request: i.Request) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for m in request.messages:
            for p in m.parts:
                if isinstance(p, i.Text):
                    kind = "input_text" if m.role == "user" else "output_text"
                    items.append({"role": m.role, "content": [{"type": kind, "text": p.text}]})
                elif isinstance(p, i.ToolCall):
                    items.append({"type": "function_call", "call_id": p.id, "name": p.name,
                                  "arguments": json.dumps(p.input)})  # fmt: skip
                else:
                    items.append({"type": "function_call_output", "call_id": p.id,
                                  "output": p.text})  # fmt: skip
        out: dict[str, Any] = {"model": request.model, "input": items, "store": False}
        if request.system:
            out["instructions"] = request.system
        if request.max_tokens is not None:
            out["max_output_tokens"] = request.max_tokens
        out.update(request.params)
        if request.tools is not None:
            out["tools"] = [{"type": "function", "name": t.name, "description": t.description,
                             "parameters": t.schema} for t in request.tools]  # fmt: skip
        choice = request.tool_choice
        if choice is not None:
            out["tool_choice"] = (
                {"type": "function", "name": choice.name} if choice.kind == "tool" else choice.kind
            )
        if request.one_call:
            out["parallel_tool_calls"] = False
        return out

    def answer_to_internal(self, document: dict[str, Any]) -> i.Answer:
        parts: list[i.Text | i.ToolCall] = []
        for item in document["output"]:
            if item["type"] == "message":
                for part in item["content"]:
                    text = part.get("text") or part.get("refusal")
                    if text:
                        parts.append(i.Text(text))
            elif item["type"] == "function_call":
                arguments = json_object(item.get("arguments", "{}"))
                if arguments is None:
                    raise Malformed
                parts.append(i.ToolCall(item["call_id"], item["name"], arguments))
        stop = provider.stop_of(document)
        counts = provider.usage_counts(document.get("usage"))
        return i.Answer(
            id=str(document.get("id", "resp")),
            model=document.get("model", ""),
            parts=tuple(parts),
            stop=FROM_STOP.get(stop or "", i.END),
            usage=i.Usage(counts.input_tokens or 0, counts.cache_write_tokens or 0,
                          counts.cache_read_tokens or 0, counts.output_tokens or 0),
        )

    def answer_from_internal(self, answer: i.Answer) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        text = "".join(p.text for p in answer.parts if isinstance(p, i.Text))
        if text:
            output.append(message_item(new_id("msg"), text))
        for p in answer.parts:
            if isinstance(p, i.ToolCall):
                output.append(call_item(new_id("fc"), p.id, p.name, json.dumps(p.input)))
        return response_object(new_id("resp"), answer.model, output, answer.stop, answer.usage)

    def stream_reader(self) -> Reader:
        return Reader()

    def stream_writer(self, model: str, usage: bool) -> Writer:
        return Writer(model, new_id("resp"))

    # ----------------------------------------------------------------- the provider's side

    def upstream_route(self, adapter: HttpAdapter, model: Model, allowance: int) -> RouteParts:
        return RouteParts(f"{adapter.base_url()}/responses", {}, "max_output_tokens")

    def credential_header(self, credential: str) -> tuple[str, str]:
        return "authorization", f"Bearer {credential}"

    def upstream_body(self, body: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
        """`max_output_tokens` set or clamped to the reply allowance; all else as sent."""
        out = dict(body)
        out["model"] = limits.upstream_id
        out["max_output_tokens"] = clamp(smaller(None, out.get("max_output_tokens")),
                                         limits.max_tokens)  # fmt: skip
        return out

    def effort_fields(self, level: Effort, body: Mapping[str, Any]) -> Mapping[str, Any]:
        value = OPENAI_REASONING_EFFORT.get(level)
        if value is None:  # `none`: the provider's default stays
            return {}
        reasoning = body.get("reasoning")
        return {"reasoning": {**(reasoning if isinstance(reasoning, dict) else {}),
                              "effort": value}}  # fmt: skip

    def parse_reply(self, reply: JsonReply) -> ProviderResponse:
        return provider.parse_response(reply)

    def observe(self, tracker: Tracker, event: Event) -> None:
        observe(tracker, event)


# --------------------------------------------------------------------------- the subset


def _is_dict(value: object) -> bool:
    return isinstance(value, dict)


def _kind(item: object) -> str:
    """An input item's type (`message` when it has only a role)."""
    if not isinstance(item, dict):
        return ""
    kind = item.get("type")
    return kind if isinstance(kind, str) else "message" if "role" in item else ""


def _add(messages: list[i.Message], role: str, part: i.Part) -> None:
    """A part joins the last message when it is of the same role (a turn's text and calls, or
    its tool results, are one message), else starts a new one."""
    if messages and messages[-1].role == role:
        last = messages[-1]
        messages[-1] = i.Message(last.role, (*last.parts, part))
    else:
        messages.append(i.Message("user" if role == "user" else "assistant", (part,)))


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict)) if isinstance(
        content, list
    ) else ""  # fmt: skip


def _output_text(item: dict[str, Any]) -> str:
    return _text(item.get("output"))


TEXT_PARTS = frozenset({"input_text", "output_text"})


def _content_ok(content: object) -> bool:
    return is_str(content) or (
        isinstance(content, list)
        and all(
            isinstance(p, dict) and p.get("type") in TEXT_PARTS and is_str(p.get("text"))
            and set(p) <= {"type", "text", "annotations", "logprobs"}
            for p in content
        )
    )  # fmt: skip


def _item_outside(item: object) -> str | None:
    """What of one input item has no internal form (`.field`), or None."""
    kind = _kind(item)
    assert isinstance(item, dict) or kind == ""
    if kind == "message":
        assert isinstance(item, dict)
        if item.get("role") not in ("user", "assistant", "system", "developer"):
            return ".role"
        if not set(item) <= {"type", "role", "content", "id", "status"}:
            return ""
        return None if _content_ok(item.get("content")) else ".content"
    if kind == "function_call":
        assert isinstance(item, dict)
        if not set(item) <= {"type", "call_id", "name", "arguments", "id", "status"}:
            return ""
        ok = is_str(item.get("call_id")) and is_str(item.get("name"))
        return None if ok and json_object(item.get("arguments", "{}")) is not None else ""
    if kind == "function_call_output":
        assert isinstance(item, dict)
        if not set(item) <= {"type", "call_id", "output", "id", "status"}:
            return ""
        ok = is_str(item.get("call_id")) and _content_ok(item.get("output"))
        return None if ok else ".output"
    if kind == "reasoning":
        return None  # dropped (DROPPED)
    return ".type"


def _function_tool(tool: object) -> bool:
    return isinstance(tool, dict) and tool.get("type") == "function"


def _tool_ok(tool: object) -> bool:
    """A function tool of the subset, or a hosted or namespaced one (dropped, DROPPED)."""
    if not isinstance(tool, dict) or not is_str(tool.get("type")):
        return False
    if not _function_tool(tool):
        return True
    return (
        is_str(tool.get("name"))
        and set(tool) <= {"type", "name", "description", "parameters", "strict"}
        and tool.get("strict") in (None, False)  # strict schemas have no translation
    )


def _outside(body: dict[str, Any]) -> str | None:
    if body.get("store") is not False:
        return "`store` (true or omitted: a stored response needs a native Responses route)"
    named = top_level(body, KEYS, NAMED)
    if named is not None:
        return named
    reasoning = body.get("reasoning")
    if reasoning is not None and not (
        isinstance(reasoning, dict) and set(reasoning) <= {"effort", "summary"}
    ):
        return "`reasoning`"
    text = body.get("text")
    if text is not None and not (
        isinstance(text, dict) and set(text) <= {"format", "verbosity"}
        and text.get("format", {"type": "text"}) == {"type": "text"}
        and text.get("verbosity") in (None, "medium")
    ):  # fmt: skip
        return "`text`"
    if "tools" in body and not (
        isinstance(body["tools"], list) and all(map(_tool_ok, body["tools"]))
    ):
        return "`tools`"
    choice = body.get("tool_choice")
    if not (choice in (None, "auto", "none", "required") or (
        isinstance(choice, dict) and set(choice) == {"type", "name"}
        and choice["type"] == "function" and is_str(choice["name"])
    )):  # fmt: skip
        return "`tool_choice`"
    items = body["input"]
    for index, item in enumerate([] if is_str(items) else items):
        field_ = _item_outside(item)
        if field_ is not None:
            return f"`input[{index}]{field_}`"
    return None


FORMAT = OpenAIResponses()
