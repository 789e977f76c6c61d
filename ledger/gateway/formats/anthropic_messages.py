"""Anthropic messages as a wire format (R-GW-1, R-FMT-1): `POST /anthropic/v1/messages`; the
`anthropic-messages` providers' requests, replies and streams."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from ledger.catalog import Model
from ledger.gateway.formats import internal as i
from ledger.gateway.formats.anthropic_hints import effort_of, plain
from ledger.gateway.formats.base import Limits, RouteParts, WireFormat
from ledger.gateway.formats.common import (
    chat_problem,
    choices_of,
    clamp,
    is_str,
    sse,
    text_of,
    text_parts,
    tokens,
    top_level,
    trailing_assistant,
)
from ledger.gateway.sse import Event, Malformed, Tracker
from ledger.providers import anthropic_messages as provider
from ledger.providers.base import HttpAdapter, ProviderResponse
from ledger.providers.bounded import JsonReply
from ledger.routing.effort import ANTHROPIC_ANSWER_FLOOR, ANTHROPIC_MIN_BUDGET, anthropic_fields
from ledger.targets import Effort

ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}
KEYS = frozenset(
    {
        "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
        "top_p", "tools", "tool_choice",
    }
)  # fmt: skip
NAMED = frozenset(
    {
        "container", "context_management", "mcp_servers", "metadata", "service_tier",
        "thinking", "top_k",
    }
)  # fmt: skip
"""The documented fields outside the subset, which a 400 may name."""
PARAMS = ("temperature", "top_p", "stream")

FROM_STOP: Mapping[str, i.Stop] = {
    "end_turn": i.END,
    "stop_sequence": i.END,
    "max_tokens": i.LENGTH,
    "model_context_window_exceeded": i.LENGTH,
    "tool_use": i.TOOL,
    "refusal": i.REFUSAL,
    # server tools only (outside the subset): the turn is over for this request
    "pause_turn": i.END,
}
TO_STOP: Mapping[i.Stop, str] = {
    i.END: "end_turn",
    i.LENGTH: "max_tokens",
    i.TOOL: "tool_use",
    i.REFUSAL: "refusal",
}
FROM_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
TO_CHOICE = {"auto": "auto", "required": "any", "none": "none"}


def thinking_budget(body: Mapping[str, Any]) -> int | None:
    """The thinking budget a body asks for (`thinking.budget_tokens` when enabled)."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else None


def internal_usage(usage: dict[str, Any]) -> i.Usage:
    return i.Usage(
        input=tokens(usage.get("input_tokens")),
        cache_write=tokens(usage.get("cache_creation_input_tokens")),
        cache_read=tokens(usage.get("cache_read_input_tokens")),
        output=tokens(usage.get("output_tokens")),
    )


class AnthropicMessages(WireFormat):
    name = "anthropic-messages"
    prefix = "/anthropic/"
    path = "/anthropic/v1/messages"
    error_event = "error"
    beta_header = "anthropic-beta"

    # ----------------------------------------------------------------- the caller's side

    def check(self, body: object) -> str | None:
        problem = chat_problem(body, ("max_tokens",))
        if problem is None and "max_tokens" not in cast(dict[str, Any], body):
            return "`max_tokens` is required"
        return problem

    def outside(self, body: dict[str, Any]) -> str | None:
        return _outside(plain(body)[0])  # hints dropped, thinking as effort (R-FMT-4)

    def dropped(self, body: dict[str, Any]) -> tuple[str, ...]:
        return plain(body)[1]

    def error_document(self, status: int, code: str, message: str) -> dict[str, Any]:
        other = "api_error" if status >= 500 else "invalid_request_error"
        kind = ERROR_TYPES.get(status, other)
        return {"type": "error", "error": {"type": kind, "message": message, "code": code}}

    def with_model(self, data: dict[str, Any], model_key: str) -> dict[str, Any]:
        if isinstance(data.get("message"), dict):
            data["message"] = {**data["message"], "model": model_key}
        return data

    def fits_allowance(self, body: Mapping[str, Any], allowance: int) -> bool:
        """Each choice gets a token (an `n` the caller sent), and thinking asked for keeps its
        minimum budget below the max_tokens sent."""
        if allowance // choices_of(body) < 1:
            return False
        if thinking_budget(body) is not None:
            return clamp(body.get("max_tokens"), allowance) > ANTHROPIC_MIN_BUDGET
        return True

    # ----------------------------------------------------------------- the internal form

    def to_internal(self, body: dict[str, Any]) -> i.Request:
        effort = effort_of(body)  # R-FMT-4: thinking as reasoning effort
        body, _ = plain(body)
        messages: list[i.Message] = []
        for m in body["messages"]:
            content = m["content"]
            if isinstance(content, str):
                messages.append(i.Message(m["role"], (i.Text(content),)))
                continue
            parts: list[i.Part] = []
            for b in content:
                if b["type"] == "text":
                    parts.append(i.Text(b["text"]))
                elif b["type"] == "tool_result":
                    parts.append(i.ToolResult(b["tool_use_id"], text_of(b.get("content", ""))))
                else:
                    parts.append(i.ToolCall(b["id"], b["name"], b.get("input", {})))
            messages.append(i.Message(m["role"], tuple(parts)))
        tools = None
        if "tools" in body:
            tools = tuple(
                i.Tool(t["name"], t.get("description", ""), _schema(t.get("input_schema")))
                for t in body["tools"]
            )
        choice = body.get("tool_choice")
        tool_choice = None
        one_call = False
        if isinstance(choice, dict):
            kind = choice["type"]
            tool_choice = (
                i.ToolChoice("tool", choice["name"])
                if kind == "tool"
                else i.ToolChoice(cast(Any, FROM_CHOICE[kind]))
            )
            one_call = (
                choice.get("disable_parallel_tool_use") is True
                and bool(body.get("tools"))
                and kind != "none"
            )
        return i.Request(
            model=body["model"],
            messages=tuple(messages),
            system=text_of(body["system"]) if "system" in body else None,
            max_tokens=body["max_tokens"],
            params={k: body[k] for k in PARAMS if k in body},
            stop=body.get("stop_sequences"),
            tools=tools,
            tool_choice=tool_choice,
            one_call=one_call,
            effort=effort,
        )

    def from_internal(self, request: i.Request) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        for m in request.messages:
            blocks = [_block(p) for p in m.parts] or [{"type": "text", "text": ""}]
            # consecutive turns of one role become one message (tool results after calls)
            if messages and messages[-1]["role"] == m.role:
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": m.role, "content": blocks})
        out: dict[str, Any] = {"model": request.model, "messages": messages}
        if request.system is not None:
            out["system"] = request.system
        if request.max_tokens is not None:
            out["max_tokens"] = request.max_tokens
        out.update(request.params)
        if request.stop is not None:
            out["stop_sequences"] = request.stop
        if request.tools is not None:
            out["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.schema}
                for t in request.tools
            ]
        choice = request.tool_choice
        if choice is not None:
            out["tool_choice"] = (
                {"type": "tool", "name": choice.name}
                if choice.kind == "tool"
                else {"type": TO_CHOICE[choice.kind]}
            )
        if request.one_call:
            held = out.get("tool_choice", {"type": "auto"})
            out["tool_choice"] = {**held, "disable_parallel_tool_use": True}
        return out

    def answer_to_internal(self, document: dict[str, Any]) -> i.Answer:
        parts: list[i.Text | i.ToolCall] = []
        for b in document["content"]:
            if b.get("type") == "text":
                parts.append(i.Text(b["text"]))
        for b in document["content"]:
            if b.get("type") == "tool_use":
                parts.append(i.ToolCall(b["id"], b["name"], b.get("input", {})))
        return i.Answer(
            id=str(document.get("id", "msg")),
            model=document.get("model", ""),
            parts=tuple(parts),
            stop=FROM_STOP.get(document.get("stop_reason") or "", i.END),
            usage=internal_usage(document.get("usage") or {}),
        )

    def answer_from_internal(self, answer: i.Answer) -> dict[str, Any]:
        usage = answer.usage
        return {
            "id": answer.id,
            "type": "message",
            "role": "assistant",
            "model": answer.model,
            "content": [_block(p) for p in answer.parts],
            "stop_reason": TO_STOP[answer.stop],
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage.input,
                "output_tokens": usage.output,
                "cache_creation_input_tokens": usage.cache_write,
                "cache_read_input_tokens": usage.cache_read,
            },
        }

    def stream_reader(self) -> Reader:
        return Reader()

    def stream_writer(self, model: str, usage: bool) -> Writer:
        return Writer(model)

    # ----------------------------------------------------------------- the provider's side

    def upstream_route(self, adapter: HttpAdapter, model: Model, allowance: int) -> RouteParts:
        version = adapter.option_str("anthropicVersion", provider.DEFAULT_VERSION)
        url = f"{adapter.base_url()}/v1/messages"
        return RouteParts(url, {"anthropic-version": version}, "max_tokens")

    def count_url(self, route_url: str) -> str | None:
        return f"{route_url}/count_tokens"  # /v1/messages/count_tokens

    def credential_header(self, credential: str) -> tuple[str, str]:
        return "x-api-key", credential

    def upstream_body(self, body: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
        """`max_tokens` set or clamped to the allowance, a thinking budget fitted below it."""
        out = dict(body)
        out["model"] = limits.upstream_id
        out["max_tokens"] = clamp(body.get("max_tokens"), limits.max_tokens)
        budget = thinking_budget(body)
        if budget is not None and budget >= out["max_tokens"]:
            # the caller's thinking budget inside the max_tokens sent, as a route effort's is
            # (R-RT-3): Anthropic refuses a budget that is not below max_tokens
            fitted = max(ANTHROPIC_MIN_BUDGET, out["max_tokens"] - ANTHROPIC_ANSWER_FLOOR)
            out["thinking"] = {**body["thinking"], "budget_tokens": fitted}
        return out

    def effort_fields(self, level: Effort, body: Mapping[str, Any]) -> Mapping[str, Any]:
        # inside the max_tokens actually sent (R-RT-3: the estimate covers it)
        return anthropic_fields(level, int(body["max_tokens"]))

    def parse_reply(self, reply: JsonReply) -> ProviderResponse:
        return provider.parse_message(reply)

    def observe(self, tracker: Tracker, event: Event) -> None:
        if event.done:
            raise Malformed
        data = event.data
        kind = data.get("type")
        if not isinstance(kind, str):
            raise Malformed
        if kind == "error":
            tracker.error = True
        elif kind == "message_start":
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):  # its output_tokens is a placeholder, not a count
                _prompt(tracker, usage)
        elif kind == "content_block_start":
            block = data.get("content_block")
            if isinstance(block, dict) and block.get("type") not in ("text", None):
                tracker.content = True
        elif kind in ("content_block_delta", "content_block_stop"):
            tracker.content = True
        elif kind == "message_delta":
            tracker.content = True
            delta = data.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                tracker.finish = delta["stop_reason"]
            usage = data.get("usage")
            if isinstance(usage, dict):
                tracker.output_tokens = provider.usage_counts(usage).output_tokens
                _prompt(tracker, usage)  # its prompt counts, when given, are the final ones
        elif kind == "message_stop":
            tracker.content = True
            tracker.terminated = True


def _prompt(tracker: Tracker, usage: dict[str, Any]) -> None:
    """The prompt's counts of a usage object, read as a whole answer's is (R-GW-5c); a count
    the event leaves out keeps the one seen before."""
    counts = provider.usage_counts(usage)
    if counts.input_tokens is not None:
        tracker.input_tokens = counts.input_tokens
    if counts.cache_write_tokens is not None:
        tracker.cache_write_tokens = counts.cache_write_tokens
    if counts.cache_read_tokens is not None:
        tracker.cache_read_tokens = counts.cache_read_tokens


def _schema(given: Any) -> dict[str, Any]:
    schema: dict[str, Any] = given or {"type": "object"}
    return schema


def _block(part: i.Part) -> dict[str, Any]:
    if isinstance(part, i.Text):
        return {"type": "text", "text": part.text}
    if isinstance(part, i.ToolCall):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": part.input}
    return {"type": "tool_result", "tool_use_id": part.id, "content": part.text}


# --------------------------------------------------------------------------- streams


@dataclass
class Reader:
    """Message events as internal events."""

    # the prompt's counts (message_start's, updated by message_delta's when it has them)
    prompt: dict[str, int] = field(default_factory=dict)

    def _count(self, usage: dict[str, Any]) -> None:
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            if usage.get(key) is not None:
                self.prompt[key] = tokens(usage[key])

    def read(self, event: Event) -> list[i.StreamEvent]:
        data = event.data or {}
        kind = data.get("type")
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                return [i.TextDelta(delta.get("text", ""))]
            if delta.get("type") == "input_json_delta":
                return [i.ToolArgs(data.get("index", 0), delta.get("partial_json", ""))]
            return []
        if kind == "message_start":
            self._count((data.get("message") or {}).get("usage") or {})
            return [i.Start()]
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") != "tool_use":
                return []
            return [i.ToolStart(data.get("index", 0), block.get("id"), block.get("name"))]
        if kind == "message_delta":
            stop = (data.get("delta") or {}).get("stop_reason") or ""
            usage = data.get("usage") or {}
            self._count(usage)
            counts = i.Usage(
                input=self.prompt.get("input_tokens", 0),
                cache_write=self.prompt.get("cache_creation_input_tokens", 0),
                cache_read=self.prompt.get("cache_read_input_tokens", 0),
                output=tokens(usage.get("output_tokens")),
            )
            return [i.Stopped(FROM_STOP.get(stop, i.END)), i.UsageSeen(counts)]
        if kind == "message_stop":
            return [i.End()]
        return []


@dataclass
class Writer:
    """Internal events as message events."""

    model: str
    started: bool = False
    block: int = -1
    block_kind: str | None = None
    tools: dict[Any, int] = field(default_factory=dict)  # source key -> block index
    stop: str | None = None
    usage: i.Usage = field(default_factory=i.Usage)
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
        return [sse({"type": "message_start", "message": message}, "message_start")]

    def _close_block(self) -> list[bytes]:
        if self.block_kind is None:
            return []
        self.block_kind = None
        return [sse({"type": "content_block_stop", "index": self.block}, "content_block_stop")]

    def _open(self, block: dict[str, Any], kind: str) -> list[bytes]:
        out = self._close_block()
        self.block += 1
        self.block_kind = kind
        start = {"type": "content_block_start", "index": self.block, "content_block": block}
        return [*out, sse(start, "content_block_start")]

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        data = {"type": "content_block_delta", "index": index, "delta": delta}
        return sse(data, "content_block_delta")

    def write(self, event: i.StreamEvent) -> list[bytes]:
        if isinstance(event, i.TextDelta):
            text = {"type": "text", "text": ""}
            out = [] if self.block_kind == "text" else self._open(text, "text")
            return [*out, self._delta(self.block, {"type": "text_delta", "text": event.text})]
        if isinstance(event, i.ToolArgs):
            delta = {"type": "input_json_delta", "partial_json": event.text}
            return [self._delta(self.tools[event.key], delta)]
        if isinstance(event, i.Start):
            return self._start()
        if isinstance(event, i.ToolStart):
            block: dict[str, Any] = {"type": "tool_use", "id": event.id, "name": event.name,
                                     "input": {}}  # fmt: skip
            out = self._open(block, "tool_use")
            self.tools[event.key] = self.block
            return out
        if isinstance(event, i.Stopped):
            self.stop = TO_STOP[event.reason]
            return self._close_block()
        if isinstance(event, i.UsageSeen):
            self.usage = event.usage
            return []
        return self.finish()  # End

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
                "output_tokens": self.usage.output,
                "input_tokens": self.usage.input,
                "cache_creation_input_tokens": self.usage.cache_write,
                "cache_read_input_tokens": self.usage.cache_read,
            },
        }
        out.append(sse(delta, "message_delta"))
        out.append(sse({"type": "message_stop"}, "message_stop"))
        return out


# --------------------------------------------------------------------------- the subset


def _block_ok(block: object, role: str) -> bool:
    if not isinstance(block, dict):
        return False
    kind = block.get("type")
    if kind == "text":
        return set(block) <= {"type", "text"} and is_str(block.get("text"))
    if kind == "tool_use" and role == "assistant":
        return (
            set(block) <= {"type", "id", "name", "input"}
            and is_str(block.get("id"))
            and is_str(block.get("name"))
            and isinstance(block.get("input", {}), dict)
        )
    if kind == "tool_result" and role == "user":
        content = block.get("content", "")
        return (
            set(block) <= {"type", "tool_use_id", "content"}
            and is_str(block.get("tool_use_id"))
            and text_parts(content)
        )
    return False


def _choice_outside(choice: object) -> str | None:
    if choice is None:
        return None
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "none", "tool"):
        return "`tool_choice`"
    allowed = {"type"} if choice["type"] == "none" else {"type", "disable_parallel_tool_use"}
    if choice["type"] == "tool":
        allowed.add("name")
        if not is_str(choice.get("name")):
            return "`tool_choice`"
    if not set(choice) <= allowed:
        return "`tool_choice`"
    if not isinstance(choice.get("disable_parallel_tool_use", False), bool):
        return "`tool_choice.disable_parallel_tool_use`"
    return None


def _outside(body: dict[str, Any]) -> str | None:
    named = top_level(body, KEYS, NAMED)
    if named is not None:
        return named
    if "system" in body and not text_parts(body["system"]):
        return "`system`"
    stops = body.get("stop_sequences")
    if "stop_sequences" in body and not (isinstance(stops, list) and all(map(is_str, stops))):
        return "`stop_sequences`"
    if "tools" in body and not (
        isinstance(body["tools"], list)
        and all(
            isinstance(t, dict)
            and is_str(t.get("name"))
            and set(t) <= {"name", "description", "input_schema"}
            for t in body["tools"]
        )
    ):
        return "`tools`"
    choice = _choice_outside(body.get("tool_choice"))
    if choice is not None:
        return choice
    for index, m in enumerate(body["messages"]):
        role = m.get("role")
        if role not in ("user", "assistant"):
            return f"`messages[{index}].role`"
        if not set(m) <= {"role", "content"}:
            return f"`messages[{index}]`"
        content = m.get("content")
        if content in ("", []):  # an empty turn: no message of another format says the same
            return f"`messages[{index}].content` (empty)"
        if not (
            is_str(content)
            or (isinstance(content, list) and all(_block_ok(b, role) for b in content))
        ):
            return f"`messages[{index}].content`"
    return trailing_assistant(body["messages"])


FORMAT = AnthropicMessages()
