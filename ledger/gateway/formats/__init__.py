"""The gateway's wire formats (R-FMT-1): each one object (`WireFormat`), registered once
(`registry`); translation goes through one internal form (`internal`, `translate`).

`Format` names the two built-in ones for tests and tools; the gateway never names a format.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

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


def caller_problem(fmt: WireFormat, body: object) -> str | None:
    """`fmt.check(body)`."""
    return fmt.check(body)


def fits_allowance(fmt: WireFormat, body: Mapping[str, Any], allowance: int) -> bool:
    """`fmt.fits_allowance(body, allowance)`."""
    return fmt.fits_allowance(body, allowance)


def upstream_body(fmt: WireFormat, body: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """`fmt.upstream_body(body, limits)`."""
    return fmt.upstream_body(body, limits)


def untranslated(fmt: WireFormat, body: dict[str, Any]) -> str | None:
    """`fmt.outside(body)`."""
    return fmt.outside(body)


__all__ = [
    "Format",
    "Limits",
    "WireFormat",
    "caller_problem",
    "fits_allowance",
    "registry",
    "untranslated",
    "upstream_body",
]
