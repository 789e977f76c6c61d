"""The common subset of the two wire formats (R-GW-3): whether every part of a request has a
faithful translation to the other format, and if not, the first part without one, named as fixed
text (a field path, never a value) for the `wire_format` 400. Pure functions; no I/O."""

from __future__ import annotations

import json
from typing import Any

from ledger.gateway.wire import Format

OPENAI_KEYS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)
ANTHROPIC_KEYS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
    }
)
# the documented fields outside the subset, which a 400 may name (any other key is the caller's
# own text, never echoed)
OPENAI_NAMED = frozenset(
    {
        "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "metadata", "modalities", "n", "prediction", "presence_penalty", "prompt_cache_key",
        "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier",
        "store", "top_logprobs", "user", "verbosity", "web_search_options",
    }
)  # fmt: skip
ANTHROPIC_NAMED = frozenset(
    {
        "container", "context_management", "mcp_servers", "metadata", "service_tier",
        "thinking", "top_k",
    }
)  # fmt: skip


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _text_parts(content: object) -> bool:
    """A string, or a list of text parts only (OpenAI `{"type": "text", "text": ...}`)."""
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict)
        and p.get("type") == "text"
        and _is_str(p.get("text"))
        and set(p) <= {"type", "text"}
        for p in content
    )


def _top_level(body: dict[str, Any], keys: frozenset[str], named: frozenset[str]) -> str | None:
    for key in body:
        if key not in keys:
            return f"`{key}`" if key in named else "a top-level field"
    return None


def _openai_message_outside(m: dict[str, Any]) -> str | None:
    """What of one OpenAI message has no Anthropic translation (`.field`), or None. A key whose
    value is null says nothing and is left out."""
    given = {k for k, v in m.items() if v is not None}
    role = m.get("role")
    if role in ("system", "developer", "user"):
        allowed = {"role", "content"}  # Anthropic has no per-message `name`
    elif role == "tool":
        allowed = {"role", "content", "tool_call_id"}
        if not _is_str(m.get("tool_call_id")):
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
        if content is not None and not _text_parts(content):
            return ".content"
        refusal = m.get("refusal")
        if refusal is not None and not _is_str(refusal):
            return ".refusal"
        if refusal and _text(content):  # one turn's text: the answer or the refusal
            return ".refusal"
        calls = m.get("tool_calls")
        if calls is not None and not (
            isinstance(calls, list) and all(_openai_call_ok(c) for c in calls)
        ):
            return ".tool_calls"
        return None
    return None if _text_parts(content) else ".content"


def _openai_call_ok(call: object) -> bool:
    if not isinstance(call, dict) or call.get("type", "function") != "function":
        return False
    if not set(call) <= {"id", "type", "function"}:
        return False
    fn = call.get("function")
    if not _is_str(call.get("id")) or not isinstance(fn, dict) or not _is_str(fn.get("name")):
        return False
    return set(fn) <= {"name", "arguments"} and _json_object(fn.get("arguments", "{}")) is not None


def _json_object(text: object) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _openai_tools_ok(tools: object) -> bool:
    return isinstance(tools, list) and all(
        isinstance(t, dict)
        and set(t) <= {"type", "function"}
        and t.get("type") == "function"
        and isinstance(t.get("function"), dict)
        and _is_str(t["function"].get("name"))
        and set(t["function"]) <= {"name", "description", "parameters"}
        for t in tools
    )


def _openai_choice_ok(choice: object) -> bool:
    if choice is None or choice in ("auto", "none", "required"):
        return True
    if not isinstance(choice, dict) or set(choice) != {"type", "function"}:
        return False
    fn = choice["function"]
    return (
        choice["type"] == "function"
        and isinstance(fn, dict)
        and set(fn) == {"name"}
        and _is_str(fn["name"])
    )


def _openai_outside(body: dict[str, Any]) -> str | None:
    named = _top_level(body, OPENAI_KEYS, OPENAI_NAMED)
    if named is not None:
        return named
    stop = body.get("stop")
    if "stop" in body and not (
        _is_str(stop) or (isinstance(stop, list) and all(map(_is_str, stop)))
    ):
        return "`stop`"
    options = body.get("stream_options")
    if options is not None and not (
        isinstance(options, dict) and set(options) <= {"include_usage"}
    ):
        return "`stream_options`"
    if not isinstance(body.get("parallel_tool_calls", False), bool):
        return "`parallel_tool_calls`"
    if "tools" in body and not _openai_tools_ok(body["tools"]):
        return "`tools`"
    if not _openai_choice_ok(body.get("tool_choice")):
        return "`tool_choice`"
    began = False  # a system message after the first turn would move to the top: outside
    for i, m in enumerate(body["messages"]):
        field_ = _openai_message_outside(m)
        if field_ is not None:
            return f"`messages[{i}]{field_}`"
        if m["role"] not in ("system", "developer"):
            began = True
        elif began:
            return f"`messages[{i}].role` (a system message after the first turn)"
    return _trailing_assistant(body["messages"])


def _trailing_assistant(messages: list[dict[str, Any]]) -> str | None:
    """An Anthropic conversation ending on an assistant turn asks for its continuation (a
    prefill); an OpenAI one for a new turn after it: neither translates to the other."""
    if messages and messages[-1].get("role") == "assistant":
        return "`messages` (ending on an assistant turn)"
    return None


def _anthropic_block_ok(block: object, role: str) -> bool:
    if not isinstance(block, dict):
        return False
    kind = block.get("type")
    if kind == "text":
        return set(block) <= {"type", "text"} and _is_str(block.get("text"))
    if kind == "tool_use" and role == "assistant":
        return (
            set(block) <= {"type", "id", "name", "input"}
            and _is_str(block.get("id"))
            and _is_str(block.get("name"))
            and isinstance(block.get("input", {}), dict)
        )
    if kind == "tool_result" and role == "user":
        content = block.get("content", "")
        return (
            set(block) <= {"type", "tool_use_id", "content"}
            and _is_str(block.get("tool_use_id"))
            and _text_parts(content)
        )
    return False


def _anthropic_choice_outside(choice: object) -> str | None:
    if choice is None:
        return None
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "none", "tool"):
        return "`tool_choice`"
    allowed = {"type"} if choice["type"] == "none" else {"type", "disable_parallel_tool_use"}
    if choice["type"] == "tool":
        allowed.add("name")
        if not _is_str(choice.get("name")):
            return "`tool_choice`"
    if not set(choice) <= allowed:
        return "`tool_choice`"
    if not isinstance(choice.get("disable_parallel_tool_use", False), bool):
        return "`tool_choice.disable_parallel_tool_use`"
    return None


def _anthropic_outside(body: dict[str, Any]) -> str | None:
    named = _top_level(body, ANTHROPIC_KEYS, ANTHROPIC_NAMED)
    if named is not None:
        return named
    if "system" in body and not _text_parts(body["system"]):
        return "`system`"
    stops = body.get("stop_sequences")
    if "stop_sequences" in body and not (isinstance(stops, list) and all(map(_is_str, stops))):
        return "`stop_sequences`"
    if "tools" in body and not (
        isinstance(body["tools"], list)
        and all(
            isinstance(t, dict)
            and _is_str(t.get("name"))
            and set(t) <= {"name", "description", "input_schema"}
            for t in body["tools"]
        )
    ):
        return "`tools`"
    choice = _anthropic_choice_outside(body.get("tool_choice"))
    if choice is not None:
        return choice
    for i, m in enumerate(body["messages"]):
        role = m.get("role")
        if role not in ("user", "assistant"):
            return f"`messages[{i}].role`"
        if not set(m) <= {"role", "content"}:
            return f"`messages[{i}]`"
        content = m.get("content")
        if content in ("", []):  # an empty turn: no OpenAI message says the same
            return f"`messages[{i}].content` (empty)"
        if not (
            _is_str(content)
            or (isinstance(content, list) and all(_anthropic_block_ok(b, role) for b in content))
        ):
            return f"`messages[{i}].content`"
    return _trailing_assistant(body["messages"])


def untranslated(fmt: Format, body: dict[str, Any]) -> str | None:
    """The first part of this request outside the subset both formats share, as fixed text
    naming the field (never a value), or None: the request translates whole."""
    return _openai_outside(body) if fmt is Format.OPENAI else _anthropic_outside(body)


def translatable(fmt: Format, body: dict[str, Any]) -> bool:
    """Every part of this request is inside the subset both formats share."""
    return untranslated(fmt, body) is None


def _text(content: Any) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
