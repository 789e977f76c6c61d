"""What the gateway does alike in every wire format (the formats themselves are objects in
`ledger.gateway.formats`, R-FMT-1). Pure functions over parsed JSON; no I/O."""

from __future__ import annotations

from typing import Any

from ledger.providers.base import INVALID_RESPONSE, ProviderResponse


def is_invalid(response: ProviderResponse) -> bool:
    """A 2xx whose body did not have the wire shape."""
    return not response.ok and response.stop_reason == INVALID_RESPONSE


def answer_model(document: dict[str, Any], model_key: str) -> dict[str, Any]:
    """The answer as the caller sees it: `model` is the model key that answered (R-GW-6)."""
    document["model"] = model_key
    return document


UNFIT = "the request does not fit the reply allowance: more choices (`n`) than it has tokens, or \
thinking with no room for its 1024-token minimum"
