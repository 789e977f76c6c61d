"""The wire formats the gateway speaks, each registered once (R-FMT-1): the endpoints mount a
route for each, the gate finds a path's format by its prefix, routing finds a route's by the
catalog `api` of its provider. Adding a format is its module and one line here; a format
registered later (a test's) is mounted on every gateway router made or subscribed after it.
"""

from __future__ import annotations

from collections.abc import Callable

from ledger.gateway.formats import (
    anthropic_messages,
    openai_chat,
    openai_embeddings,
    openai_responses,
)
from ledger.gateway.formats.base import WireFormat

_BY_NAME: dict[str, WireFormat] = {}
_BY_PREFIX: dict[str, WireFormat] = {}
_LISTENERS: list[Callable[[WireFormat], None]] = []
_FOR_ROUTE: dict[tuple[str, str], WireFormat | None] = {}


def register(fmt: WireFormat) -> WireFormat:
    """Add a format: its name and path prefix must be new. Every subscriber hears of it."""
    if fmt.name in _BY_NAME or fmt.prefix in _BY_PREFIX:
        raise ValueError(f"a wire format named {fmt.name} or under {fmt.prefix} exists")
    _BY_NAME[fmt.name] = fmt
    _BY_PREFIX[fmt.prefix] = fmt
    _FOR_ROUTE.clear()
    for listener in _LISTENERS:
        listener(fmt)
    return fmt


def subscribe(listener: Callable[[WireFormat], None]) -> None:
    """Call `listener` for every format registered so far and every one registered later."""
    _LISTENERS.append(listener)
    for fmt in list(_BY_NAME.values()):
        listener(fmt)


def formats() -> list[WireFormat]:
    """Every registered format, in registration order."""
    return list(_BY_NAME.values())


def by_name(name: str) -> WireFormat | None:
    """The format of this name (a provider's catalog `api`), None when none is registered."""
    return _BY_NAME.get(name)


def for_route(api: str, kind: str) -> WireFormat | None:
    """The format a route speaks: the one its provider's `api` names for a chat model, the one
    of the model's kind its provider speaks otherwise (R-FMT-3); None when none is registered."""
    key = (api, kind)
    if key not in _FOR_ROUTE:
        _FOR_ROUTE[key] = next(
            (f for f in _BY_NAME.values() if f.kind == kind and f.spoken_by(api)), None
        )
    return _FOR_ROUTE[key]


def by_path(path: str) -> WireFormat | None:
    """The format a gateway path belongs to (by its longest prefix), None for every other
    path."""
    found = [p for p in _BY_PREFIX if path.startswith(p)]
    return _BY_PREFIX[max(found, key=len)] if found else None


register(openai_chat.FORMAT)
register(anthropic_messages.FORMAT)
register(openai_responses.FORMAT)
register(openai_embeddings.FORMAT)
