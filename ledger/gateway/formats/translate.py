"""Translation between wire formats over the internal form (R-GW-3, R-FMT-1): a request, an
answer or a stream of one format reaches another as source -> internal -> target; the same format
is passed through untouched.

Invariant: a request is translated only when every part of it is inside the internal form
(`WireFormat.outside` is None); any other part keeps it off other formats' routes (`serves`,
routing's `wire_format` 400 naming the part when no route is left), so nothing is ever dropped
silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ledger.gateway.formats.anthropic_messages import FORMAT as ANTHROPIC
from ledger.gateway.formats.base import StreamTranslator, WireFormat
from ledger.gateway.formats.openai_chat import FORMAT as OPENAI
from ledger.gateway.sse import Malformed


def serves(route: WireFormat | None, caller: WireFormat, translatable: bool) -> bool:
    """A route of format `route` can serve a caller's request: the same format, or another one
    a provider speaks when the request is inside the internal form."""
    return route is caller or (route is not None and translatable and route.kind == caller.kind)


def dropped_for(caller: WireFormat, route: WireFormat, body: dict[str, Any]) -> tuple[str, ...]:
    """What of the caller's body a route of another format does not get (hints only, R-FMT-4);
    nothing on a route of the caller's own format."""
    return () if caller is route else caller.dropped(body)


def betas_for(
    caller: WireFormat, route: WireFormat, flags: tuple[str, ...], allowed: Callable[[str], bool]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The opt-in flags (`anthropic-beta`) forwarded to a route, and the dropped ones as
    `header:flag` (R-FMT-4): forwarded only to a route taking the same header whose provider
    allows the flag (catalog `betas`)."""
    header = caller.beta_header
    same = header is not None and route.beta_header == header
    kept = tuple(f for f in flags if same and allowed(f))
    return kept, tuple(f"{header}:{f}" for f in flags if f not in kept)


def native(route: WireFormat | None, caller: WireFormat) -> bool:
    """A route of the caller's own format: the body passes through untranslated (and only such a
    route can serve what the format keeps, R-FMT-2)."""
    return route is caller


def request_for(caller: WireFormat, route: WireFormat, body: dict[str, Any]) -> dict[str, Any]:
    """The caller's body in the route's format (unchanged when they are the same)."""
    if caller is route:
        return body
    return route.from_internal(caller.to_internal(body))


def reply_for(caller: WireFormat, route: WireFormat, document: dict[str, Any]) -> dict[str, Any]:
    """The route's answer in the caller's format (Malformed when it cannot be read)."""
    if caller is route:
        return document
    try:
        answer = route.answer_to_internal(document)
    except (KeyError, TypeError, AttributeError, IndexError):
        raise Malformed from None
    return caller.answer_from_internal(answer)


def stream_translator(
    caller: WireFormat, route: WireFormat, model: str, usage: bool = True
) -> StreamTranslator | None:
    """The stream translator for a route of another format (None for the same one); `usage`:
    the caller asked to see the usage."""
    if caller is route:
        return None
    return StreamTranslator(route.stream_reader(), caller.stream_writer(model, usage))


def OpenAIFromAnthropic(model: str, usage: bool = True) -> StreamTranslator:
    """An Anthropic stream for an OpenAI caller (the pair the translation tests read)."""
    return StreamTranslator(ANTHROPIC.stream_reader(), OPENAI.stream_writer(model, usage))


def AnthropicFromOpenAI(model: str) -> StreamTranslator:
    """An OpenAI stream for an Anthropic caller."""
    return StreamTranslator(OPENAI.stream_reader(), ANTHROPIC.stream_writer(model, True))
