"""The two wire formats the gateway speaks (R-GW-1, R-GW-3, R-GW-6): OpenAI chat completions and
Anthropic messages. Pure functions over parsed JSON; no I/O.

Invariant: an error body built here holds only fixed text and reason codes, never a value the
caller or a provider sent; the caller's body leaves here changed only in the model, the max-tokens
field and (OpenAI streams) `stream_options.include_usage`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ledger.providers.base import INVALID_RESPONSE, ProviderResponse
from ledger.providers.bounded import JsonReply
from ledger.routing.effort import ANTHROPIC_ANSWER_FLOOR, ANTHROPIC_MIN_BUDGET


class Format(StrEnum):
    """A caller's (or a route's) wire format, named by its catalog `api`."""

    OPENAI = "openai-chat"
    ANTHROPIC = "anthropic-messages"


OPENAI_ERROR_TYPES: Mapping[int, str] = {
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
ANTHROPIC_ERROR_TYPES: Mapping[int, str] = {
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


def error_document(fmt: Format, status: int, code: str, message: str) -> dict[str, Any]:
    """The format's own error shape with `code` (a reason code or a fixed code) and fixed text."""
    if fmt is Format.ANTHROPIC:
        other = "api_error" if status >= 500 else "invalid_request_error"
        kind = ANTHROPIC_ERROR_TYPES.get(status, other)
        return {"type": "error", "error": {"type": kind, "message": message, "code": code}}
    other = "server_error" if status >= 500 else "invalid_request_error"
    kind = OPENAI_ERROR_TYPES.get(status, other)
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def stream_error_event(fmt: Format, status: int, code: str, message: str) -> bytes:
    """The format's error event, ending a stream after its first content event (R-GW-5)."""
    document = error_document(fmt, status, code, message)
    data = json.dumps(document, separators=(",", ":"))
    if fmt is Format.ANTHROPIC:
        return f"event: error\ndata: {data}\n\n".encode()
    return f"data: {data}\n\n".encode()


@dataclass(frozen=True)
class Limits:
    """What the gateway sets in the upstream body."""

    upstream_id: str
    max_tokens: int
    max_tokens_field: str  # OpenAI: `max_tokens` or `max_completion_tokens`


def upstream_body(fmt: Format, body: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """The caller's body for one route: the model, the max-tokens field set or clamped to the
    reply allowance, and OpenAI's `stream_options.include_usage` on streams; all else as sent."""
    out = dict(body)
    out["model"] = limits.upstream_id
    if fmt is Format.ANTHROPIC:
        asked = body.get("max_tokens")
        out["max_tokens"] = _clamp(asked, limits.max_tokens)
        budget = thinking_budget(body)
        if budget is not None and budget >= out["max_tokens"]:
            # the caller's thinking budget inside the max_tokens sent, as a route effort's is
            # (R-RT-3): Anthropic refuses a budget that is not below max_tokens
            fitted = max(ANTHROPIC_MIN_BUDGET, out["max_tokens"] - ANTHROPIC_ANSWER_FLOOR)
            out["thinking"] = {**body["thinking"], "budget_tokens": fitted}
        return out
    asked = None
    for name in ("max_completion_tokens", "max_tokens"):
        if name in out:
            asked = _smaller(asked, out.pop(name))
    # `n` choices share the one reply allowance the reservation's estimate covers: the field
    # caps each choice, so each gets an equal part (`choices_fit` says whether there is one)
    share = max(1, limits.max_tokens // choices_of(body))
    out[limits.max_tokens_field] = _clamp(asked, share)
    if body.get("stream") is True:
        options = body.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        options["include_usage"] = True
        out["stream_options"] = options
    return out


def _smaller(a: object, b: object) -> int | None:
    values = [v for v in (a, b) if isinstance(v, int) and not isinstance(v, bool)]
    return min(values) if values else None


def _clamp(asked: object, allowance: int) -> int:
    if isinstance(asked, int) and not isinstance(asked, bool) and 0 < asked < allowance:
        return asked
    return allowance


def parse_reply(fmt: Format, reply: JsonReply) -> ProviderResponse:
    """Usage and stop reason of a 2xx body, by the provider adapters' own parsers."""
    from ledger.providers.anthropic_messages import parse_message
    from ledger.providers.openai_chat import parse_chat_completion

    parse = parse_message if fmt is Format.ANTHROPIC else parse_chat_completion
    return parse(reply)


def is_invalid(response: ProviderResponse) -> bool:
    """A 2xx whose body did not have the wire shape."""
    return not response.ok and response.stop_reason == INVALID_RESPONSE


def answer_model(document: dict[str, Any], model_key: str) -> dict[str, Any]:
    """The answer as the caller sees it: `model` is the model key that answered (R-GW-6)."""
    document["model"] = model_key
    return document


def wants_usage(fmt: Format, body: Mapping[str, Any]) -> bool:
    """Whether a streaming caller asked to see usage: OpenAI's only with
    `stream_options.include_usage` (the gateway always asks upstream, to settle the stream, and
    shows the usage-only chunk, whose `choices` is empty, only to a caller who asked); Anthropic's
    streams always carry it."""
    if fmt is Format.ANTHROPIC:
        return True
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def usage_only(event_data: object) -> bool:
    """An OpenAI chunk carrying usage and no choice (the one `include_usage` adds)."""
    return (
        isinstance(event_data, dict)
        and event_data.get("choices") == []
        and event_data.get("usage") is not None
    )


MAX_CHOICES = 128
"""The most choices (`n`) an OpenAI request may ask for (OpenAI's own bound). Each choice is capped
at the reply allowance divided by `n`, so all of them together stay inside the estimate the
reservation made; a route whose allowance is smaller than `n` cannot serve the request."""


def choices_of(body: Mapping[str, Any]) -> int:
    """How many choices an (already checked) body asks for: OpenAI's `n`, else 1."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def thinking_budget(body: Mapping[str, Any]) -> int | None:
    """The thinking budget an Anthropic body asks for (`thinking.budget_tokens` when enabled)."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else None


UNFIT = "the request does not fit the reply allowance: more choices (`n`) than it has tokens, or \
thinking with no room for its 1024-token minimum"


def fits_allowance(fmt: Format, body: Mapping[str, Any], allowance: int) -> bool:
    """Whether a route with this reply allowance can serve the body within the reservation's
    estimate: each of the `n` choices gets a token, and thinking asked for keeps its minimum
    budget below the max_tokens sent (else UNFIT: nothing is sent)."""
    if allowance // choices_of(body) < 1:
        return False
    if fmt is Format.ANTHROPIC and thinking_budget(body) is not None:
        max_tokens = _clamp(body.get("max_tokens"), allowance)
        return max_tokens > ANTHROPIC_MIN_BUDGET
    return True


def caller_problem(fmt: Format, body: object) -> str | None:
    """Fixed text naming what is wrong with a caller's body, or None (types only; no value)."""
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
    names = ("max_tokens",) if fmt is Format.ANTHROPIC else ("max_tokens", "max_completion_tokens")
    for name in names:
        value = body.get(name)
        if (
            name in body
            and value is not None
            and (not isinstance(value, int) or isinstance(value, bool) or value <= 0)
        ):
            return f"`{name}` must be a positive integer"
    if fmt is Format.ANTHROPIC and "max_tokens" not in body:
        return "`max_tokens` is required"
    choices = body.get("n")
    if fmt is Format.OPENAI and choices is not None and not (
        isinstance(choices, int) and not isinstance(choices, bool) and 1 <= choices <= MAX_CHOICES
    ):
        return f"`n` must be an integer from 1 to {MAX_CHOICES}"
    return None
