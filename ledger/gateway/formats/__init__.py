"""The gateway's wire formats (R-FMT-1): each one object (`WireFormat`), registered once
(`registry`); translation goes through one internal form (`internal`, `translate`).

`Format` names the two built-in ones for tests and tools; the gateway never names a format.
"""

from __future__ import annotations

from collections.abc import Iterator

from ledger.gateway.formats import registry
from ledger.gateway.formats.anthropic_messages import FORMAT as ANTHROPIC_MESSAGES
from ledger.gateway.formats.base import Limits, WireFormat
from ledger.gateway.formats.openai_chat import FORMAT as OPENAI_CHAT


class _Listed(type):
    def __iter__(cls) -> Iterator[WireFormat]:
        return iter((OPENAI_CHAT, ANTHROPIC_MESSAGES))


class Format(metaclass=_Listed):
    """The built-in formats by name (iterating it lists them)."""

    OPENAI: WireFormat = OPENAI_CHAT
    ANTHROPIC: WireFormat = ANTHROPIC_MESSAGES


__all__ = [
    "Format",
    "Limits",
    "WireFormat",
    "registry",
]
