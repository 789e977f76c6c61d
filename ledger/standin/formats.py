"""The wire formats the provider stand-in speaks, as strict as the real APIs (issue 13 item 4).

Invariant: `request_problem` refuses what the real OpenAI chat-completions and Anthropic messages
APIs refuse (with their status and error type), and every body built here parses with the
official SDKs' own types (checked by tests/test_standin_sdk.py). Pure functions, no I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

ANTHROPIC_FIELDS = frozenset(
    {
        "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream",
        "temperature", "top_k", "top_p", "tools", "tool_choice", "thinking", "service_tier",
        "container", "mcp_servers", "context_management", "output_config",
    }
)  # fmt: skip
OPENAI_FIELDS = frozenset(
    {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
        "stream", "stream_options", "stop", "presence_penalty", "frequency_penalty", "logit_bias",
        "logprobs", "top_logprobs", "user", "response_format", "seed", "tools", "tool_choice",
        "parallel_tool_calls", "reasoning_effort", "service_tier", "store", "metadata",
        "modalities", "audio", "prediction", "web_search_options", "verbosity",
        "safety_identifier", "prompt_cache_key", "functions", "function_call",
    }
)  # fmt: skip
ANTHROPIC_ROLES = frozenset({"user", "assistant", "system"})
"""Claude Code 2.1 sends its environment as a `system`-role message after the first user turn;
a conversation that opens with one (a chat-style system prompt) is still refused."""
OPENAI_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

# Anthropic's error.type per status (docs: "Errors"); OpenAI's error.type/code per status.
ANTHROPIC_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
OPENAI_ERRORS: Mapping[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    402: ("insufficient_quota", "insufficient_quota"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}
OPENAI_QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})


def request_problem(
    anthropic: bool, headers: Mapping[str, str], body: Any
) -> tuple[int, str | None] | None:
    """(status, error code) the real API answers this request with, or None when accepted."""
    if anthropic:
        # The official SDK (2.x) sends its key as a bearer token; our adapter sends x-api-key.
        if not headers.get("x-api-key") and not headers.get("authorization"):
            return 401, "authentication_error"
        if not headers.get("anthropic-version"):
            return 400, "invalid_request_error"
    if not isinstance(body, dict) or not set(body) <= (
        ANTHROPIC_FIELDS if anthropic else OPENAI_FIELDS
    ):
        return 400, None
    if not isinstance(body.get("model"), str) or not body["model"]:
        return 400, None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return 400, None
    roles = ANTHROPIC_ROLES if anthropic else OPENAI_ROLES
    first = messages[0]
    if anthropic and isinstance(first, dict) and first.get("role") == "system":
        return 400, None  # the system prompt is the top-level `system`, not a first message
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in roles:
            return 400, None
        content = message.get("content")
        # OpenAI: an assistant turn that calls tools may have null content
        called = not anthropic and message.get("tool_calls") and message["role"] == "assistant"
        if not isinstance(content, str | list) and not (content is None and called):
            return 400, None
    limits = ("max_tokens",) if anthropic else ("max_tokens", "max_completion_tokens")
    present = [body[name] for name in limits if name in body]
    if anthropic and not present:
        return 400, None  # Anthropic requires max_tokens
    if len(present) > 1 or not all(_positive_int(v) for v in present):
        return 400, None
    if anthropic and "system" in body and not isinstance(body["system"], str | list):
        return 400, None
    return None


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def error_json(
    anthropic: bool,
    status: int,
    code: str | None,
    *,
    pad_to: int | None = None,
    message: str | None = None,
    detail_code: str | None = None,
) -> dict[str, Any]:
    """An error body in the real API's shape; `code` is Anthropic's error.type or OpenAI's code."""
    text = "scripted error" if message is None else message
    if pad_to is not None and pad_to > len(text):
        text += "." * (pad_to - len(text))
    if anthropic:
        error: dict[str, Any] = {
            "type": code or ANTHROPIC_ERROR_TYPES.get(status, "api_error"),
            "message": text,
        }
        if detail_code is not None:
            error["details"] = {"error_code": detail_code}
        return {"type": "error", "error": error, "request_id": "req_standin"}
    default_type, default_code = OPENAI_ERRORS.get(
        status, ("server_error", None) if status >= 500 else ("invalid_request_error", None)
    )
    if code in OPENAI_QUOTA_CODES:
        default_type = code
    return {
        "error": {
            "message": text,
            "type": default_type,
            "param": None,
            "code": code if code is not None else default_code,
        }
    }


def openai_success(
    model: str,
    text: str,
    stop_reason: str | None,
    input_tokens: int,
    output_tokens: int,
    cost_usd: float | None = None,
    *,
    cache: tuple[int, int] = (0, 0),
    tool_call: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A chat.completion object; `prompt_tokens` includes the cached (`cache`: written, read);
    `tool_call` (name, JSON arguments) makes it a tool call."""
    written, read = cache
    prompt = input_tokens + written + read
    details: dict[str, Any] = {"cached_tokens": read, "audio_tokens": 0}
    if written:
        details["cache_write_tokens"] = written  # OpenRouter-style, in the SDK's type
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": output_tokens,
        "total_tokens": prompt + output_tokens,
        "prompt_tokens_details": details,
    }
    if cost_usd is not None:
        usage["cost"] = cost_usd
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": _openai_message(text, tool_call),
                "logprobs": None,
                "finish_reason": stop_reason or ("tool_calls" if tool_call else "stop"),
            }
        ],
        "usage": usage,
    }


def anthropic_success(
    model: str,
    text: str,
    stop_reason: str | None,
    input_tokens: int,
    output_tokens: int,
    *,
    cache: tuple[int, int] = (0, 0),
    tool_call: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A messages `message` object; `input_tokens` leaves out the cache (written, read);
    `tool_call` (name, JSON arguments) adds a tool_use block."""
    written, read = cache
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if tool_call is not None:
        content.append({"type": "tool_use", "id": TOOL_CALL_ID, "name": tool_call[0],
                        "input": json.loads(tool_call[1])})  # fmt: skip
    return {
        "id": "msg_standin",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason or ("tool_use" if tool_call else "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": written,
                "ephemeral_1h_input_tokens": 0,
            },
        },
    }


TOOL_CALL_ID = "call_standin_1"


def _openai_message(text: str, tool_call: tuple[str, str] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_call is not None:
        message["tool_calls"] = [{"id": TOOL_CALL_ID, "type": "function",
                                  "function": {"name": tool_call[0], "arguments": tool_call[1]}}]
    return message


def _pieces(text: str, count: int) -> list[str]:
    """`text` in `count` nearly equal pieces (at least one, none empty unless text is)."""
    count = max(1, min(count, len(text) or 1))
    size = -(-len(text) // count) if text else 1
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse(data: Any, event: str | None = None) -> bytes:
    line = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
    return (f"event: {event}\n" + line).encode() if event else line.encode()


StreamEvent = tuple[str, bytes]
"""(role, bytes): role is `preamble`, `content`, `finish`, `usage` or `terminator`."""


def openai_stream(
    model: str, text: str, stop_reason: str | None, input_tokens: int, output_tokens: int,
    pieces: int = 3, *, cache: tuple[int, int] = (0, 0),
) -> list[StreamEvent]:
    """A chat.completion.chunk stream with `stream_options.include_usage` (usage chunk last,
    read as `openai_success`'s: `prompt_tokens` includes the cached, `cache` written and read)."""
    base = {"id": "chatcmpl-standin", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}  # fmt: skip

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [choice]}

    events: list[StreamEvent] = [("preamble", _sse(chunk({"role": "assistant", "content": ""})))]
    events += [("content", _sse(chunk({"content": p}))) for p in _pieces(text, pieces)]
    events.append(("finish", _sse(chunk({}, stop_reason or "stop"))))
    usage = openai_success(model, "", None, input_tokens, output_tokens, cache=cache)["usage"]
    events.append(("usage", _sse({**base, "choices": [], "usage": usage})))
    events.append(("terminator", _sse("[DONE]")))
    return events


def anthropic_stream(
    model: str, text: str, stop_reason: str | None, input_tokens: int, output_tokens: int,
    pieces: int = 3, *, cache: tuple[int, int] = (0, 0),
) -> list[StreamEvent]:
    """A messages event stream: message_start … message_stop, usage in start (the prompt's
    counts, `cache` written and read among them, as the real API sends) and delta."""
    written, read = cache
    message: dict[str, Any] = {
        "id": "msg_standin", "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1,
                  "cache_creation_input_tokens": written, "cache_read_input_tokens": read},
    }  # fmt: skip
    events: list[StreamEvent] = [
        ("preamble", _sse({"type": "message_start", "message": message}, "message_start")),
        ("preamble", _sse({"type": "content_block_start", "index": 0,
                           "content_block": {"type": "text", "text": ""}},
                          "content_block_start")),
        ("preamble", _sse({"type": "ping"}, "ping")),
    ]  # fmt: skip
    for piece in _pieces(text, pieces):
        delta = {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "text_delta", "text": piece}}  # fmt: skip
        events.append(("content", _sse(delta, "content_block_delta")))
    events.append(
        ("content", _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    )
    finish = {"type": "message_delta",
              "delta": {"stop_reason": stop_reason or "end_turn", "stop_sequence": None},
              "usage": {"output_tokens": output_tokens}}  # fmt: skip
    events.append(("finish", _sse(finish, "message_delta")))
    events.append(("terminator", _sse({"type": "message_stop"}, "message_stop")))
    return events
