"""A failed attempt's settle (R-POL-1..9): the policy table's decision written to the
reservation, the cooldowns, the probes, the strikes and the source (ledger.policy_table.decide
decides; this module reads what it needs and writes what it returns)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    RowMapping,
    func,
    insert,
    select,
    update,
)

from ledger.catalog import Model
from ledger.kinds import (
    AttemptRole,
    AttemptStatus,
    CooldownScope,
    FollowUp,
    SourceState,
)
from ledger.policy_table import Decision, FailureContext, InteractivePace, decide
from ledger.records import Failed, SettleResult
from ledger.store import health, probes, reads
from ledger.store.cooldowns import upsert_cooldown
from ledger.store.costs import cost_changed, usage_columns, with_overrun
from ledger.store.notices import record_notice, record_pause
from ledger.store.pool_choice import settle_lease
from ledger.store.schema import (
    reservations,
    sources,
    transport_strikes,
)

STRIKE_WINDOW_MS = 15 * 60_000


def held_probes(conn: Connection, row: Row[Any]) -> dict[tuple[CooldownScope, str], int]:
    """The targets a settling reservation is the probe of (none read unless it holds one)."""
    r = row._mapping
    if not r["holds_probe"]:
        return {}
    return probes.held_by(conn, int(r["id"]), int(r["deadline_ms"]))


def settle_failure(
    conn: Connection,
    now: int,
    row: Row[Any],
    model: Model | None,
    outcome: Failed,
    late: bool,
    base: dict[str, object],
    jitter: Callable[[], float],
    pace: InteractivePace | None = None,
) -> SettleResult:
    r = row._mapping
    cls = outcome.classification
    src = conn.execute(select(sources).where(sources.c.id == r["source_id"])).one()._mapping
    strikes = conn.execute(
        select(func.count())
        .select_from(transport_strikes)
        .where(
            transport_strikes.c.model_key == r["model_key"],
            transport_strikes.c.at_ms > now - STRIKE_WINDOW_MS,
        )
    ).scalar_one()
    provider = str(r["provider"])
    existing = {
        (scope, target): until
        for scope, target in (
            (CooldownScope.PROVIDER, provider),
            (CooldownScope.MODEL, str(r["model_key"])),
        )
        if (until := reads.cooldown_until(conn, scope, target, now)) is not None
    }
    held = held_probes(conn, row)
    decision: Decision = decide(
        FailureContext(
            classification=cls,
            model_key=str(r["model_key"]),
            now_ms=now,
            recent_transport_strikes=int(strikes),
            failures=int(src["failures"]),
            output_failures=int(src["output_failures"]),
            backoff_steps=int(src["backoff_steps"]),
            correction_used=bool(src["correction_used"]),
            side_effects=outcome.side_effects,
            was_follow_up=r["after_id"] is not None,
            override=r["role"] == AttemptRole.OVERRIDE.value,
            existing_cooldowns=existing,
            probe_streaks=held,
            pace=pace,
        ),
        jitter,
    )
    usage = with_overrun(row, usage_columns(model, outcome), now)
    actual = usage["actual_micro"]
    cost = actual if actual is not None else r["estimate_micro"]
    actions = list(decision.actions)
    follow_up = None
    immediate = r["after_id"] is None and r["role"] != AttemptRole.OVERRIDE.value
    if decision.use_correction and immediate:
        follow_up = FollowUp.CORRECTION.value
    elif decision.retry_after_ms is not None:
        follow_up = FollowUp.RETRY.value
    elif decision.fallback is not None:
        follow_up = FollowUp.FALLBACK.value
    conn.execute(
        update(reservations)
        .where(reservations.c.id == r["id"])
        .values(
            follow_up=follow_up,
            status=AttemptStatus.FAILED.value,
            kind=decision.kind.value,
            subkind=decision.subkind,
            reason=decision.reason,
            side_effects=outcome.side_effects,
            **usage,
            cost_micro=cost,
            **base,
        )
    )
    cost_changed(conn, row, cost, usage)
    for action in decision.cooldowns:
        upsert_cooldown(
            conn,
            now,
            action.scope,
            action.target,
            action.until_ms,
            action.kind.value,
            action.origin,
        )
        probes.arm(conn, action.scope, action.target)  # policy and hint cooldowns end in a probe
    actions += probes.settle_probes(
        conn,
        now,
        held,
        decision.kind,
        [(a.scope, a.target) for a in decision.cooldowns],
        claimed_ms=int(r["created_ms"]),
    )
    health.record(conn, now, provider, str(r["model_key"]), decision.kind.value)
    settle_lease(conn, now, row, success=False)
    pause_reason = apply_to_source(conn, now, src, decision, str(r["model_key"]))
    if decision.transport_strike:
        conn.execute(insert(transport_strikes).values(model_key=r["model_key"], at_ms=now))
    source_id = str(r["source_id"])
    if pause_reason != decision.pause_reason:
        actions.append("not paused: the source is finished (R-RES-3)")
    if late:
        actions.append("late: usage recorded; the result must not be committed")
    return SettleResult(
        int(r["id"]),
        source_id,
        str(r["model_key"]),
        AttemptStatus.FAILED,
        late,
        kind=decision.kind.value,
        subkind=decision.subkind,
        reason=decision.reason,
        actions=tuple(actions),
        fallback=None if decision.fallback is None else decision.fallback.value,
        use_correction=decision.use_correction,
        retry_after_ms=decision.retry_after_ms,
        paused=pause_reason,
        cost_micro=cost,
    )


def apply_to_source(
    conn: Connection,
    now: int,
    src: RowMapping,
    decision: Decision,
    model_key: str,
    message: str | None = None,
) -> str | None:
    """Write one failure's decision to its source (`src`: its row, read in the caller's write
    transaction): counters, backoff, owed correction, pause, and the deduplicated failure and
    pause notices (R-DIAG-4). Returns the pause reason written; a finished source is never
    paused (R-RES-3)."""
    changes: dict[str, object] = {}
    if decision.counts_failure:
        changes["failures"] = sources.c.failures + 1
    if decision.counts_output_failure:
        changes["output_failures"] = sources.c.output_failures + 1
    if decision.backoff_until_ms is not None:
        changes["retry_at_ms"] = decision.backoff_until_ms
        changes["backoff_steps"] = sources.c.backoff_steps + 1
    if decision.use_correction:
        changes["correction_used"] = True
        changes["correction_reason"] = decision.reason
    pause_reason = decision.pause_reason
    if src["state"] == SourceState.DONE.value:
        pause_reason = None  # R-RES-3: finished is final, never flipped to paused
    if pause_reason is not None:
        # the lease stays with its worker, which releases it (resume cannot hand it out)
        changes["state"] = SourceState.PAUSED.value
        changes["pause_reason"] = pause_reason
    source_id = str(src["id"])
    if changes:
        conn.execute(update(sources).where(sources.c.id == source_id).values(**changes))
    if decision.counts_failure:
        record_notice(
            conn,
            now,
            "failure",
            # keyed by everything the message says, so a count never misstates it (R-DIAG-4)
            f"failure:{source_id}:{decision.kind.value}:{decision.subkind}:{model_key}",
            message or f"{decision.kind.value} ({decision.subkind}) on {model_key}",
            source_id,
        )
    if pause_reason is not None:
        record_pause(conn, now, source_id, pause_reason)
    return pause_reason
