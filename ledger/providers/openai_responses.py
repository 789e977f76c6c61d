"""Adapter for the OpenAI Responses API (R-HTTP-1, R-FMT-2): `POST {baseUrl}/responses`.

Invariant: returns raw facts only (status, headers, bounded error body, stop reason, usage);
the credential is sent as a bearer token and appears nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ledger.providers.base import (
    CallRequest,
    HttpAdapter,
    ProviderResponse,
    UsageCounts,
    token_count,
)
from ledger.providers.bounded import JsonReply, post_and_parse
from ledger.routing.effort import OPENAI_REASONING_EFFORT

INCOMPLETE_STOPS: Mapping[str, str] = {
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}
"""A response's `incomplete_details.reason` as the stop reason the classifier reads."""


class OpenAIResponsesAdapter(HttpAdapter):
    """POST {baseUrl}/responses (stateless: `store` false)."""

    def call(self, request: CallRequest, *, now_ms: Callable[[], int]) -> ProviderResponse:
        """Make one Responses call within the request deadline."""
        headers = self.option_headers()
        credential = self.credential()
        if credential is not None:
            headers["authorization"] = f"Bearer {credential}"
        url = f"{self.base_url()}/responses"
        payload: dict[str, Any] = {
            "model": request.model_id,
            "input": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_output_tokens": request.max_tokens,
            "store": False,
        }
        level = OPENAI_REASONING_EFFORT.get(request.effort) if request.effort else None
        if level is not None:  # R-RT-3 (`none` sends none)
            payload["reasoning"] = {"effort": level}
        return post_and_parse(self.client, url, headers, payload, request, now_ms, parse_response)


def stop_of(response: Mapping[str, Any]) -> str | None:
    """The stop reason of a response object: `length` or `content_filter` when incomplete,
    `refusal` when its message refused, `tool_calls` when it called a function, else `stop`;
    None for a response that did not finish (failed, in progress)."""
    status = response.get("status")
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return INCOMPLETE_STOPS.get(reason if isinstance(reason, str) else "", "length")
    if status not in ("completed", None):
        return None
    output = response.get("output")
    items = [o for o in output if isinstance(o, dict)] if isinstance(output, list) else []
    if any(o.get("type") == "function_call" for o in items):
        return "tool_calls"
    for item in items:
        parts = item.get("content") if item.get("type") == "message" else None
        if isinstance(parts, list) and any(
            isinstance(p, dict) and p.get("type") == "refusal" for p in parts
        ) and not text_of(response):
            return "refusal"
    return "stop"


def text_of(response: Mapping[str, Any]) -> str:
    """The output text of a response object (its messages' `output_text` parts)."""
    output = response.get("output")
    texts: list[str] = []
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        for part in item.get("content") or []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                text = part.get("text")
                texts.append(text if isinstance(text, str) else "")
    return "".join(texts)


def usage_counts(usage: object) -> UsageCounts:
    """The counts of a response's `usage`: `input_tokens` includes the cached ones
    (`input_tokens_details.cached_tokens`, read; `cache_write_tokens`, written), so the input
    tokens are the rest; `output_tokens` includes the reasoning tokens (billed as output)."""
    if not isinstance(usage, dict):
        usage = {}
    details = usage.get("input_tokens_details")
    details = details if isinstance(details, dict) else {}
    read = token_count(details.get("cached_tokens"))
    written = token_count(details.get("cache_write_tokens"))
    total = token_count(usage.get("input_tokens"))
    return UsageCounts(
        input_tokens=None if total is None else max(0, total - (read or 0) - (written or 0)),
        output_tokens=token_count(usage.get("output_tokens")),
        cache_write_tokens=written,
        cache_read_tokens=read,
    )


def parse_response(reply: JsonReply) -> ProviderResponse:
    """Facts from a Responses body; a wrong shape is INVALID_RESPONSE."""
    data = reply.data
    if not isinstance(data, dict) or not isinstance(data.get("output"), list):
        return reply.invalid()
    if data.get("status") == "failed":
        return reply.invalid()
    counts = usage_counts(data.get("usage"))
    return ProviderResponse(
        ok=True,
        status=reply.status,
        text=text_of(data),
        stop_reason=stop_of(data),
        input_tokens=counts.input_tokens,
        output_tokens=counts.output_tokens,
        elapsed_ms=reply.elapsed_ms(),
        cache_write_tokens=counts.cache_write_tokens,
        cache_read_tokens=counts.cache_read_tokens,
    )
