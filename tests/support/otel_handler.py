"""A worker handler for the tracing tests (R-OTEL-1): each call goes to the stand-in with a
marked prompt; the answer breaks the JSON contract unless it came from a fallback model, so a
source meets its primary, the corrective prompt and then a fallback."""

from __future__ import annotations

from ledger.kinds import AttemptRole, FailureKind
from ledger.providers.base import Message
from ledger.worker.handler import Job
from ledger.worker.queue import HandlerResult

PROMPT = "WORKER-PROMPT-MARKER-5e1d"


def contract_handler(job: Job) -> HandlerResult:
    """Fails `invalid_output/json_contract` unless the attempt is a fallback."""
    response = job.call([Message("user", PROMPT)])
    if job.role is AttemptRole.FALLBACK:
        return HandlerResult.success(response)
    return HandlerResult.failure(FailureKind.INVALID_OUTPUT, "json_contract", response=response)
