"""What the gateway does alike in every wire format (the formats themselves are objects in
`ledger.gateway.formats`, R-FMT-1). Pure functions over parsed JSON; no I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ledger.providers.base import INVALID_RESPONSE, ProviderResponse

if TYPE_CHECKING:
    from ledger.attempt import Attempt
    from ledger.gateway.upstream import Prepared

DROPPED_HEADER = "x-ledger-dropped"
MAX_BETAS = 64


def is_invalid(response: ProviderResponse) -> bool:
    """A 2xx whose body did not have the wire shape."""
    return not response.ok and response.stop_reason == INVALID_RESPONSE


def answer_model(document: dict[str, Any], model_key: str) -> dict[str, Any]:
    """The answer as the caller sees it: `model` is the model key that answered (R-GW-6)."""
    document["model"] = model_key
    return document


UNFIT = "the request does not fit the reply allowance: more choices (`n`) than it has tokens, or \
thinking with no room for its 1024-token minimum"


def beta_flags(value: str | None) -> tuple[str, ...]:
    """The flags of a comma-separated beta header, in order, each once (at most MAX_BETAS)."""
    if not value:
        return ()
    flags = dict.fromkeys(f.strip() for f in value.split(",") if f.strip())
    return tuple(flags)[:MAX_BETAS]


def answer_headers(attempt: Attempt[Prepared]) -> dict[str, str]:
    """R-GW-6's headers of the attempt that answered, and `x-ledger-dropped` naming what its
    route did not get (R-FMT-4), when anything."""
    headers = attempt.headers()
    dropped = attempt.prepared.dropped
    if dropped:
        headers[DROPPED_HEADER] = ",".join(dropped)
    return headers
