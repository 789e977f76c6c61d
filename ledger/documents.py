"""JSON forms of the work queue's records, as the service sends them and `LedgerClient` reads
them back (times stay integer UTC ms: these answers are for workers, not for people)."""


from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.clock import iso
from ledger.records import micro_to_usd
from ledger.store.queue import Claim, OwedFallback, PendingCorrection, QueueTimes
from ledger.store.views import CooldownChange


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


def change_json(change: CooldownChange) -> dict[str, Any]:
    """The target, the cooldown in force (`until`, null when none) and every one that refuses."""
    top = change.in_force
    return {
        "scope": change.scope.value,
        "target": change.target,
        "until": None if top is None else iso(top.until_ms),
        "remaining_s": None if top is None else round((top.until_ms - change.now_ms) / 1000, 3),
        "kind": None if top is None else top.kind,
        "origin": None if top is None else top.origin.value,
        "cooldowns": [c.to_json(change.now_ms) for c in change.blocking],
    }


def set_json(change: CooldownChange) -> dict[str, Any]:
    """`cooldown set --json`: the change plus the manual row (never shortened, R-POL-2)."""
    manual = change.manual_row()
    until = change.manual_until_ms if manual is None else manual.until_ms
    assert until is not None
    return {
        **change_json(change),
        "manual": {
            "until": iso(until),
            "remaining_s": round((until - change.now_ms) / 1000, 3),
            "reason": None if manual is None else manual.reason,
        },
    }


def source_json(row: dict[str, Any]) -> dict[str, Any]:
    """One row of `source list --json`."""
    return {
        "id": row["id"],
        "state": row["state"],
        # in the worker queue (`source add`), as opposed to a source only reserved for through
        # the API; was `queued`, which read `"state": "queued", "queued": false` (issue 33)
        "in_worker_queue": bool(row["in_queue"]),
        "calls": int(row.get("calls", 0)) + int(row["archived_calls"]),
        "failures": row["failures"],
        "output_failures": row["output_failures"],
        "retry_at": iso(row["retry_at_ms"]),
        "last_checked": iso(row["last_checked_ms"]),
        "lease_owner": row["lease_owner"],
        "lease_expires": iso(row["lease_expires_ms"]),
        "correction_used": bool(row["correction_used"]),
        "pause_reason": row["pause_reason"],
        "finished": iso(row["finished_ms"]),
    }


def correction_label(doc: dict[str, Any]) -> str | None:
    """What `source show` says about the source's one correction (the same model asked again with
    the output error; policy_table offers it on a source's first `invalid_output` only). Issue 33:
    "correction available" on a done source or after a 429 offered what could not apply; None when
    nothing can be said (the source is done and never used it)."""
    if doc["correction_used"]:
        reason = doc.get("correction_reason")
        return f"used ({reason})" if reason else "used"
    if doc["state"] == "done":
        return None
    if doc["output_failures"]:
        return "not offered (only on a first invalid output)"
    return "unused (offered if an output fails validation)"


def attempt_json(a: dict[str, Any]) -> dict[str, Any]:
    """One attempt of `source show --json`."""
    return {
        "id": a["id"],
        "created": iso(a["created_ms"]),
        "model": a["model_key"],
        "role": a["role"],
        "fallback": a["role"] == "fallback",
        "correction": a["role"] == "correction",
        "override": a["role"] == "override",
        "fallback_from": a["fallback_from"],
        # R-DIAG-5: an immediate follow-up names the failed attempt it followed in the same item
        "immediate": a["after_id"] is not None,
        "after": a["after_id"],
        "permits": a["follow_up"],  # the one follow-up this failure permitted (R-POL-4)
        "status": a["status"],
        "kind": a["kind"],
        "subkind": a["subkind"],
        "reason": a["reason"],
        "late": bool(a["late"]),
        "duration_ms": a["duration_ms"],
        "deadline": iso(a["deadline_ms"]),
        "input_tokens": a["input_tokens"],
        "output_tokens": a["output_tokens"],
        "cache_write_tokens": a["cache_write_tokens"],
        "cache_read_tokens": a["cache_read_tokens"],
        "estimate_usd": micro_to_usd(a["estimate_micro"]),
        "cost_usd": micro_to_usd(a["actual_micro"]),
    }


def source_document(detail: dict[str, Any]) -> dict[str, Any]:
    """`source show --json`: counters plus the whole failover history (R-DIAG-5)."""
    budget = detail["budget"]
    doc = source_json({**detail["source"], "calls": len(detail["attempts"])})
    doc["models"] = sorted(budget.models)
    doc["time_used_ms"] = budget.time_used_ms
    doc["open_allowance_ms"] = sum(detail["open_allowance"])
    doc["open_reservations"] = len(detail["open_allowance"])
    doc["backoff_steps"] = detail["source"]["backoff_steps"]
    doc["correction_reason"] = detail["source"]["correction_reason"]
    doc["attempts"] = [attempt_json(a) for a in detail["attempts"]]
    return doc
