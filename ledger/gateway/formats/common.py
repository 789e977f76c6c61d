"""Small pure helpers the format modules share: reading text and JSON out of a body, token
counts, the max-tokens clamp, an SSE event's bytes, and the checks every chat-like body makes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def is_str(value: object) -> bool:
    return isinstance(value, str)


def text_of(content: Any) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def text_parts(content: object) -> bool:
    """A string, or a list of text parts only (`{"type": "text", "text": ...}`)."""
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict)
        and p.get("type") == "text"
        and is_str(p.get("text"))
        and set(p) <= {"type", "text"}
        for p in content
    )


def json_object(text: object) -> dict[str, Any] | None:
    """The JSON object a string holds (`""` is `{}`), else None."""
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def tokens(value: object) -> int:
    """A token count from a reply's usage (anything but a count is none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def smaller(a: object, b: object) -> int | None:
    values = [v for v in (a, b) if isinstance(v, int) and not isinstance(v, bool)]
    return min(values) if values else None


def clamp(asked: object, allowance: int) -> int:
    """The max tokens sent: the caller's when it is a count below the allowance, else it."""
    if isinstance(asked, int) and not isinstance(asked, bool) and 0 < asked < allowance:
        return asked
    return allowance


def choices_of(body: Mapping[str, Any]) -> int:
    """How many choices an (already checked) body asks for: OpenAI's `n`, else 1."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def sse(data: Any, name: str | None = None) -> bytes:
    """One server-sent event (`data` a JSON value, or text sent as is)."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return ((f"event: {name}\n" if name else "") + f"data: {text}\n\n").encode()


def top_level(body: dict[str, Any], keys: frozenset[str], named: frozenset[str]) -> str | None:
    """The first top-level key outside `keys`: named when documented (`named`), else not (a key
    the caller made up is their own text, never echoed)."""
    for key in body:
        if key not in keys:
            return f"`{key}`" if key in named else "a top-level field"
    return None


def chat_problem(body: object, counts: tuple[str, ...]) -> str | None:
    """What every chat body must be (types only; fixed text, no value): an object with a
    `model`, non-empty `messages` of objects, a boolean `stream`, positive `counts` fields."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "`model` must be a non-empty string"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "`messages` must be a non-empty list"
    if not all(isinstance(m, dict) for m in messages):
        return "every message must be an object"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "`stream` must be true or false"
    for name in counts:
        value = body.get(name)
        if (
            name in body
            and value is not None
            and (not isinstance(value, int) or isinstance(value, bool) or value <= 0)
        ):
            return f"`{name}` must be a positive integer"
    return None


def trailing_assistant(messages: list[dict[str, Any]]) -> str | None:
    """A conversation ending on an assistant turn asks Anthropic for its continuation (a
    prefill), OpenAI for a new turn after it: no faithful translation either way."""
    if messages and messages[-1].get("role") == "assistant":
        return "`messages` (ending on an assistant turn)"
    return None
