"""Provider HTTP adapters (R-HTTP-1..3): they report raw facts; the worker classifies them."""

from __future__ import annotations

from ledger.providers.base import (
    INVALID_RESPONSE,
    CallRequest,
    Message,
    ProviderAdapter,
    ProviderResponse,
)
from ledger.providers.registry import adapter_for

__all__ = [
    "INVALID_RESPONSE",
    "CallRequest",
    "Message",
    "ProviderAdapter",
    "ProviderResponse",
    "adapter_for",
]
