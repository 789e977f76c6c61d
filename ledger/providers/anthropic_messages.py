"""Adapter for the Anthropic messages API (R-HTTP-1).

Invariant: returns raw facts only (status, headers, bounded error body, stop reason, usage);
the credential is sent as `x-api-key` and appears nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable

from ledger.providers.base import (
    CallRequest,
    HttpAdapter,
    ProviderResponse,
    UsageCounts,
    token_count,
)
from ledger.providers.bounded import JsonReply, post_and_parse
from ledger.routing.effort import anthropic_fields

DEFAULT_VERSION = "2023-06-01"


class AnthropicMessagesAdapter(HttpAdapter):
    """POST {baseUrl}/v1/messages; system messages go to the top-level `system` field."""

    anthropic_limits = True

    def call(self, request: CallRequest, *, now_ms: Callable[[], int]) -> ProviderResponse:
        """Make one messages call within the request deadline."""
        headers = self.option_headers()
        headers["anthropic-version"] = self.option_str("anthropicVersion", DEFAULT_VERSION)
        credential = self.credential()
        if credential is not None:
            headers["x-api-key"] = credential
        system = [m.content for m in request.messages if m.role == "system"]
        payload: dict[str, object] = {
            "model": request.model_id,
            "max_tokens": request.max_tokens,
            "messages": [
                {"role": m.role, "content": m.content}
                for m in request.messages
                if m.role != "system"
            ],
        }
        if system:
            payload["system"] = "\n\n".join(system)
        payload.update(anthropic_fields(request.effort, request.max_tokens))  # R-RT-3
        url = f"{self.base_url()}/v1/messages"
        return post_and_parse(self.client, url, headers, payload, request, now_ms, parse_message)


def parse_message(reply: JsonReply) -> ProviderResponse:
    """Facts from a messages body (text blocks joined); a wrong shape is INVALID_RESPONSE."""
    data = reply.data
    if not isinstance(data, dict):
        return reply.invalid()
    content = data.get("content")
    stop = data.get("stop_reason")
    if not isinstance(content, list) or not (stop is None or isinstance(stop, str)):
        return reply.invalid()
    texts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            return reply.invalid()
        if block.get("type") == "text":
            text = block.get("text")
            if not isinstance(text, str):
                return reply.invalid()
            texts.append(text)
    counts = usage_counts(data.get("usage"))
    return ProviderResponse(
        ok=True,
        status=reply.status,
        text="".join(texts),
        stop_reason=stop,
        input_tokens=counts.input_tokens,
        output_tokens=counts.output_tokens,
        cache_write_tokens=counts.cache_write_tokens,
        cache_read_tokens=counts.cache_read_tokens,
        elapsed_ms=reply.elapsed_ms(),
    )


def usage_counts(usage: object) -> UsageCounts:
    """The counts of a messages `usage` object (a whole answer's, or a stream's `message_start`
    and `message_delta`): `input_tokens` already leaves out the cache writes and reads."""
    if not isinstance(usage, dict):
        usage = {}
    return UsageCounts(
        input_tokens=token_count(usage.get("input_tokens")),
        output_tokens=token_count(usage.get("output_tokens")),
        cache_write_tokens=token_count(usage.get("cache_creation_input_tokens")),
        cache_read_tokens=token_count(usage.get("cache_read_input_tokens")),
    )
