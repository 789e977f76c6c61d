"""Adapter for the OpenAI-compatible chat-completions API (R-HTTP-1).

Invariant: returns raw facts only (status, headers, bounded error body, finish reason, usage);
the credential is sent as a bearer token and appears nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from ledger.catalog import known_max_tokens_field
from ledger.providers.base import (
    CallRequest,
    HttpAdapter,
    ProviderResponse,
    UsageCounts,
    reported_cost,
    token_count,
)
from ledger.providers.bounded import JsonReply, post_and_parse
from ledger.routing.effort import openai_fields

OPENAI_HOST = "api.openai.com"


def max_tokens_field(request: CallRequest, url: str) -> str:
    """`max_completion_tokens` for reasoning models and on OpenAI's own API, else `max_tokens`.

    OpenAI rejects `max_tokens` for o-series/reasoning models and deprecates it everywhere;
    other OpenAI-compatible servers (local ones especially) may know only `max_tokens`. A known
    endpoint that honours only one of the two names always gets that one.
    """
    base = url.removesuffix("/chat/completions")
    known = known_max_tokens_field(base)
    if known is not None:
        return known
    if request.reasoning or urlsplit(url).hostname == OPENAI_HOST:
        return "max_completion_tokens"
    return "max_tokens"


class OpenAIChatAdapter(HttpAdapter):
    """POST {baseUrl}/chat/completions."""

    def call(self, request: CallRequest, *, now_ms: Callable[[], int]) -> ProviderResponse:
        """Make one chat-completions call within the request deadline."""
        headers = self.option_headers()
        credential = self.credential()
        if credential is not None:
            headers["authorization"] = f"Bearer {credential}"
        url = f"{self.base_url()}/chat/completions"
        payload = {
            "model": request.model_id,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            max_tokens_field(request, url): request.max_tokens,
            **openai_fields(request.effort),  # R-RT-3
        }
        return post_and_parse(
            self.client, url, headers, payload, request, now_ms, parse_chat_completion
        )


def gemini_block_reason(data: dict[str, object]) -> str | None:
    """Gemini's `promptFeedback.blockReason`, else the `finishReason` of a first candidate that
    carries no content, when a reply has no choices (R-POL-11): the raw enum, for the worker to
    classify as a stop reason. A candidate with content is no block: the shape stays invalid."""
    feedback = data.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if reason is None:
        candidates = data.get("candidates")
        first = candidates[0] if isinstance(candidates, list) and candidates else None
        empty = isinstance(first, dict) and not first.get("content")
        reason = first.get("finishReason") if isinstance(first, dict) and empty else None
    return reason if isinstance(reason, str) and 0 < len(reason) <= 64 else None


def parse_chat_completion(reply: JsonReply) -> ProviderResponse:
    """Facts from a chat-completions body; a wrong shape is INVALID_RESPONSE."""
    data = reply.data
    if not isinstance(data, dict):
        return reply.invalid()
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        blocked = gemini_block_reason(data)
        if blocked is not None:  # a Gemini reply passed through: the prompt or reply was blocked
            return ProviderResponse(
                ok=True, status=reply.status, text="", stop_reason=blocked,
                elapsed_ms=reply.elapsed_ms(),
            )  # fmt: skip
        return reply.invalid()
    message = choices[0].get("message")
    stop = choices[0].get("finish_reason")
    if not isinstance(message, dict) or not (stop is None or isinstance(stop, str)):
        return reply.invalid()
    content = message.get("content")
    refusal = message.get("refusal")
    if content is None and isinstance(refusal, str) and refusal:
        # OpenAI reports a safety refusal in `message.refusal`, not in the finish reason.
        stop = "refusal"
    elif not (content is None or isinstance(content, str)):
        return reply.invalid()
    usage = data.get("usage")
    counts = usage_counts(usage)
    return ProviderResponse(
        ok=True,
        status=reply.status,
        text=content if isinstance(content, str) else "",
        stop_reason=stop,
        input_tokens=counts.input_tokens,
        output_tokens=counts.output_tokens,
        cost_usd=reported_cost(usage.get("cost")) if isinstance(usage, dict) else None,
        elapsed_ms=reply.elapsed_ms(),
        cache_write_tokens=counts.cache_write_tokens,
        cache_read_tokens=counts.cache_read_tokens,
    )


def usage_counts(usage: object) -> UsageCounts:
    """The counts of a chat-completions `usage` object (a whole answer's, or a stream's usage
    chunk): `prompt_tokens` includes the cached ones (`prompt_tokens_details.cached_tokens`, and
    OpenRouter's `cache_write_tokens`), so the input tokens are the rest."""
    if not isinstance(usage, dict):
        usage = {}
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        details = {}
    cache_read = token_count(details.get("cached_tokens"))
    cache_write = token_count(details.get("cache_write_tokens"))
    return UsageCounts(
        input_tokens=_uncached(token_count(usage.get("prompt_tokens")), cache_read, cache_write),
        output_tokens=token_count(usage.get("completion_tokens")),
        cache_write_tokens=cache_write,
        cache_read_tokens=cache_read,
    )


def _uncached(prompt: int | None, *cached: int | None) -> int | None:
    """`prompt_tokens` includes the cached ones: the rest are billed at the input price.

    Never negative: a reply claiming more cached than prompt tokens is counted in full (an
    over-count, never an under-count).
    """
    if prompt is None:
        return None
    return max(0, prompt - sum(n or 0 for n in cached))
