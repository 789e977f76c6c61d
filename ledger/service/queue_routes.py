"""`/v1/queue/…`: the work queue's lease operations, so `ledger worker run --server` drains the
queue through the service (each route one `Ledger` call, in a worker thread)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ledger.documents import claim_json, times_json
from ledger.service.answers import (
    ClaimOut,
    CommitFailedOut,
    CompactOut,
    DeferOut,
    HeldOut,
    QueueTimesOut,
    ReleaseSpentOut,
)
from ledger.service.bodies import ClaimBody, CommitFailedBody, CompactBody, LeaseBody, RenewBody
from ledger.service.calls import LedgerDep
from ledger.service.openapi import GATE, WITH_BODY, errors

router = APIRouter(prefix="/v1/queue", tags=["queue"])
BODY_ERRORS = errors(*WITH_BODY)


@router.post("/claim", operation_id="claim", response_model=ClaimOut, responses=BODY_ERRORS)
def claim(body: ClaimBody, ledger: LedgerDep) -> JSONResponse:
    """Lease the due source checked longest ago (`{"claim": null}` when nothing is due)."""
    claimed = ledger.claim(
        body.worker_id, checked_before=body.checked_before, skip_scopes=body.skip_scopes
    )
    return JSONResponse(claim_json(claimed))


@router.post("/renew", operation_id="renew", response_model=HeldOut, responses=BODY_ERRORS)
def renew(body: RenewBody, ledger: LedgerDep) -> JSONResponse:
    """Extend a lease this worker holds; `held: false` when it was lost (or paused)."""
    held = ledger.renew(
        body.source, body.worker_id, cover_until_ms=body.cover_until_ms, unpaused=body.unpaused
    )
    return JSONResponse({"held": held})


@router.post("/finish", operation_id="finish", response_model=HeldOut, responses=BODY_ERRORS)
def finish(body: LeaseBody, ledger: LedgerDep) -> JSONResponse:
    """Mark the leased source done; `held: false` when the lease was lost."""
    return JSONResponse({"held": ledger.finish(body.source, body.worker_id)})


@router.post(
    "/release", operation_id="release", response_model=HeldOut, responses=BODY_ERRORS
)
def release(body: LeaseBody, ledger: LedgerDep) -> JSONResponse:
    """Give the lease back."""
    return JSONResponse({"held": ledger.release(body.source, body.worker_id)})


@router.post(
    "/release-spent",
    operation_id="release_spent",
    response_model=ReleaseSpentOut,
    responses=BODY_ERRORS,
)
def release_spent(body: LeaseBody, ledger: LedgerDep) -> JSONResponse:
    """Give the lease back after a `source_calls` / `source_time` refusal; a source that has used
    that cap is paused with it (`paused`: the reason, null when released as usual)."""
    return JSONResponse({"paused": ledger.release_spent(body.source, body.worker_id)})


@router.post(
    "/defer", operation_id="defer_owed_fallback", response_model=DeferOut, responses=BODY_ERRORS
)
def defer(body: LeaseBody, ledger: LedgerDep) -> JSONResponse:
    """No alternate for an owed fallback: the generic backoff; the new retry time."""
    return JSONResponse({"retry_at_ms": ledger.defer_owed_fallback(body.source, body.worker_id)})


@router.post(
    "/commit-failed",
    operation_id="commit_failed",
    response_model=CommitFailedOut,
    responses=BODY_ERRORS,
)
def commit_failed(body: CommitFailedBody, ledger: LedgerDep) -> JSONResponse:
    """The handler's commit raised: one failure of the source with its backoff; `held: false`
    when the lease was lost meanwhile."""
    failure = ledger.commit_failed(body.source, body.worker_id, body.model)
    if failure is None:
        return JSONResponse({"held": False, "retry_at_ms": None, "paused": None})
    return JSONResponse(
        {"held": True, "retry_at_ms": failure.retry_at_ms, "paused": failure.paused}
    )


@router.get(
    "/times", operation_id="queue_times", response_model=QueueTimesOut, responses=errors(*GATE)
)
def times(ledger: LedgerDep) -> JSONResponse:
    """Ledger time now and when queued work next becomes due."""
    return JSONResponse(times_json(ledger.queue_times()))


@router.post(
    "/compact", operation_id="compact", response_model=CompactOut, responses=BODY_ERRORS
)
def compact(body: CompactBody, ledger: LedgerDep) -> JSONResponse:
    """One bounded compaction step (R-DB-6)."""
    return JSONResponse({"folded": ledger.compact(body.batch)})
