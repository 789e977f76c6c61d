"""The gateway's answers that are not an upstream reply: one exception, rendered by the endpoint
in the caller's wire format (R-GW-6). Messages are fixed text, or name only what the ledger itself
holds (a reason code, a scope, a catalog model key, a time); nothing the caller or a provider
sent is ever part of one."""

from __future__ import annotations

import math

from ledger.kinds import RefusalReason
from ledger.status.refusal_text import gateway_refusal_text

TOO_MANY = ("too_many_connections", "too many connections; retry shortly")
"""A 503's code and text when the service's connection pools are full (R-SRV-9); the service
answers the same on its own paths."""
RETRY_AFTER_S = 1

LONG_WAIT_S = 60
"""R-GW-6a: a refusal whose retry time is further away than this tells the SDKs not to retry
(`x-should-retry: false`); both official SDK families would otherwise sleep its Retry-After."""


class GatewayError(Exception):
    """An answer with an HTTP status, a code (a reason code for refusals) and fixed text."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retry_after_s: int | None = None,
        attempts: int = 0,
        should_retry: bool | None = None,
        scope: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        self.attempts = attempts  # upstream attempts made before this answer (x-ledger-attempts)
        self.should_retry = should_retry  # None: no `x-should-retry` header (the SDKs decide)
        self.scope = scope  # a refusal's scope (R-SC-1), for the refusal counts


def seconds_until(at_ms: int | None, now_ms: int) -> int | None:
    """Whole seconds until `at_ms` (at least 1), for a Retry-After header."""
    if at_ms is None:
        return None
    return max(1, math.ceil((at_ms - now_ms) / 1000))


def refused(
    code: str, subject: str, retry_at_ms: int | None, now_ms: int, scope: str | None = None
) -> GatewayError:
    """R-GW-6, R-GW-6a: a refusal is 429 with Retry-After when known and the reason code as its
    code; its text names `subject` (the scope or target that refused) and the retry time. When
    the retry time is more than LONG_WAIT_S away, or unknown (waiting does not clear it; a scope's
    open slots excepted: one may free at any moment), it also says `x-should-retry: false`."""
    wait = seconds_until(retry_at_ms, now_ms)
    long_wait = code != RefusalReason.SCOPE_IN_FLIGHT if wait is None else wait > LONG_WAIT_S
    text = gateway_refusal_text(code, subject, wait, now_ms)
    return GatewayError(
        429, code, text, wait, should_retry=False if long_wait else None, scope=scope
    )
