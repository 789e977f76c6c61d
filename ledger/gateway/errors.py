"""The gateway's answers that are not an upstream reply: one exception, rendered by the endpoint
in the caller's wire format (R-GW-6). Messages are fixed text; nothing the caller or a provider
sent is ever part of one."""

from __future__ import annotations


class GatewayError(Exception):
    """An answer with an HTTP status, a code (a reason code for refusals) and fixed text."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retry_after_s: int | None = None,
        attempts: int = 0,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        self.attempts = attempts  # upstream attempts made before this answer (x-ledger-attempts)


REFUSED_MESSAGE = "refused by the ledger's policy: {code} (see `ledger status`)"
"""A refusal (budget, cooldown, paused, probing with no backup): HTTP 429 with this text."""


def refused(code: str, retry_after_s: int | None) -> GatewayError:
    """R-GW-6: a refusal is 429 with Retry-After when known and the reason code as its code."""
    return GatewayError(429, code, REFUSED_MESSAGE.format(code=code), retry_after_s)
