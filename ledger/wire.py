"""JSON forms of the work queue's records, as the service sends them and `LedgerClient` reads
them back (times stay integer UTC ms: these answers are for workers, not for people)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.store.queue import Claim, OwedFallback, PendingCorrection, QueueTimes


def claim_json(claim: Claim | None) -> dict[str, Any]:
    """`{"claim": …}` for a leased source, `{"claim": null}` when nothing is due."""
    if claim is None:
        return {"claim": None}
    correction, owed = claim.correction, claim.owed_fallback
    return {
        "claim": {
            "source": claim.source_id,
            "payload_ref": claim.payload_ref,
            "worker_id": claim.worker_id,
            "claimed_ms": claim.claimed_ms,
            "lease_expires_ms": claim.lease_expires_ms,
            "correction": None
            if correction is None
            else {"model": correction.model, "reason": correction.reason},
            "owed_fallback": None
            if owed is None
            else {
                "failed_model": owed.failed_model,
                "tried": sorted(owed.tried),
                "deferred": owed.deferred,
            },
        }
    }


def claim_of(doc: Mapping[str, Any]) -> Claim | None:
    """The `Claim` a `claim_json` document describes."""
    c = doc["claim"]
    if c is None:
        return None
    correction, owed = c["correction"], c["owed_fallback"]
    return Claim(
        source_id=str(c["source"]),
        payload_ref=c["payload_ref"],
        worker_id=str(c["worker_id"]),
        claimed_ms=int(c["claimed_ms"]),
        lease_expires_ms=int(c["lease_expires_ms"]),
        correction=None
        if correction is None
        else PendingCorrection(str(correction["model"]), str(correction["reason"])),
        owed_fallback=None
        if owed is None
        else OwedFallback(
            str(owed["failed_model"]), frozenset(owed["tried"]), bool(owed["deferred"])
        ),
    )


def times_json(times: QueueTimes) -> dict[str, Any]:
    """Ledger time now and when queued work next becomes due."""
    return {
        "now_ms": times.now_ms,
        "next_retry_ms": times.next_retry_ms,
        "next_lease_expiry_ms": times.next_lease_expiry_ms,
    }


def times_of(doc: Mapping[str, Any]) -> QueueTimes:
    """The `QueueTimes` a `times_json` document describes."""
    return QueueTimes(int(doc["now_ms"]), doc["next_retry_ms"], doc["next_lease_expiry_ms"])
