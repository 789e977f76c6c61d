"""The store: the only place that speaks SQL. Every public method is exactly one transaction.

Every write method is `@rehearsed`: on a ledger with no database yet it is answered by the empty
ledger when it fails, is refused or records nothing, and creates the database only otherwise.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import bindparam, select, update

from ledger.budgets import checks as budgets
from ledger.budgets.unit import Budget, Measure, Window
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.errors import LedgerError, NotFoundError, Refused, UsageError
from ledger.kinds import CooldownOrigin, CooldownScope, SourceState
from ledger.policy_table import InteractivePace
from ledger.records import Outcome, Reservation, SettleResult, SourceStateChange
from ledger.store import probes
from ledger.store import reservations as res_ops
from ledger.store import scopes as scope_ops
from ledger.store.batch import Answered, Step, write_steps
from ledger.store.cooldowns import clear_cooldowns, upsert_cooldown
from ledger.store.engine import Database
from ledger.store.pending import PendingDatabase, rehearsed
from ledger.store.schema import sources
from ledger.store.views import CooldownChange, blocking_cooldowns

__all__ = ["Database", "Store"]

_SOURCE_STATE = select(sources.c.state).where(sources.c.id == bindparam("b_id"))


class Store:
    """Ledger state in one database; each method is one read or one write transaction."""

    def __init__(
        self,
        db: Database,
        jitter: Callable[[], float] = random.random,
        budgets: Sequence[Budget] = (),
    ) -> None:
        self.db = db
        self.jitter = jitter
        self.budgets = tuple(budgets)  # checked besides the policy's (ledger.budgets.unit)

    @rehearsed
    def reserve(
        self, policy: Policy, request: res_ops.ReserveRequest, policy_fp: str
    ) -> Reservation:
        """Check every budget and cooldown and insert the reservation, atomically (R-DB-2)."""
        with self.db.write() as txn:
            now = txn.now
            verdict = res_ops.reserve(txn.conn, now, policy, request, policy_fp, self.budgets)
        return _granted(verdict, now)

    def reserve_step(
        self, policy: Policy, request: res_ops.ReserveRequest, policy_fp: str
    ) -> Step[Reservation]:
        """`reserve` as one step of a group commit (R-SRV-3)."""
        return Step(
            lambda conn, now: res_ops.reserve(conn, now, policy, request, policy_fp, self.budgets),
            _granted,
        )

    @rehearsed
    def settle(
        self, catalog: Catalog, reservation_id: int, outcome: Outcome, *, overran: bool = False
    ) -> SettleResult:
        """Record an outcome and apply the policy table in one write transaction."""
        with self.db.write() as txn:
            return res_ops.settle(
                txn.conn, txn.now, catalog, reservation_id, outcome, self.jitter, overran=overran
            )

    def settle_step(
        self,
        catalog: Catalog,
        reservation_id: int,
        outcome: Outcome,
        *,
        overran: bool = False,
        pace: InteractivePace | None = None,
    ) -> Step[SettleResult]:
        """`settle` as one step of a group commit (R-SRV-3); `pace` as in R-GW-4."""
        return Step(lambda conn, now: res_ops.settle(
            conn, now, catalog, reservation_id, outcome, self.jitter, overran=overran, pace=pace))

    def write_steps(self, steps: Sequence[Step[Any]]) -> list[Answered[Any]]:
        """Steps in arrival order, in one write transaction, each as if alone (group commit)."""
        if isinstance(self.db, PendingDatabase) and self.db.pending:
            return [_alone(self.db, step) for step in steps]
        return write_steps(self.db, steps)

    # --- sources -------------------------------------------------------------------------

    @rehearsed
    def add_source(
        self,
        source_id: str,
        payload_ref: str | None,
        enqueue: bool = True,
        scopes: Sequence[str] = (),
    ) -> bool:
        """Create (or enqueue) a source, under `scopes` too; returns True when it was new."""
        with self.db.write() as txn:
            row = txn.conn.execute(_SOURCE_STATE, {"b_id": source_id}).first()
            if row is None:
                res_ops.insert_source(
                    txn.conn, source_id, txn.now, in_queue=enqueue, payload_ref=payload_ref
                )
                scope_ops.add_source_scopes(txn.conn, source_id, scopes)
                return True
            scope_ops.add_source_scopes(txn.conn, source_id, scopes)
            values: dict[str, Any] = {"in_queue": enqueue or None}
            if payload_ref is not None:
                values["payload_ref"] = payload_ref
            values = {k: v for k, v in values.items() if v is not None}
            if values:
                txn.conn.execute(update(sources).where(sources.c.id == source_id).values(**values))
            return False

    @rehearsed
    def set_source_state(self, source_id: str, action: str) -> SourceStateChange:
        """pause / resume / done a source; returns its new state."""
        with self.db.write() as txn:
            row = txn.conn.execute(select(sources).where(sources.c.id == source_id)).first()
            if row is None:
                raise NotFoundError("unknown source")
            values: dict[str, Any]
            if action == "pause":
                if row.state == SourceState.DONE.value:
                    raise Refused("source_settled")
                if row.state == SourceState.PAUSED.value:  # the policy's reason is kept
                    return SourceStateChange(source_id, row.state, True, row.pause_reason)
                # a live lease stays with its worker (issue 12 item 3); it releases it
                values = {"state": SourceState.PAUSED.value, "pause_reason": "manual"}
            elif action == "resume":
                if row.state == SourceState.DONE.value:
                    raise Refused("source_settled")
                values = _resumed(row.lease_owner, row.lease_expires_ms, txn.now)
            elif action == "done":
                values = {
                    "state": SourceState.DONE.value,
                    "finished_ms": txn.now,
                    "lease_owner": None,
                    "lease_expires_ms": None,
                }
            else:  # pragma: no cover - CLI passes fixed words
                raise UsageError("unknown source action")
            txn.conn.execute(update(sources).where(sources.c.id == source_id).values(**values))
            return SourceStateChange(
                source_id, str(values["state"]), False, values.get("pause_reason", row.pause_reason)
            )

    # --- cooldowns -----------------------------------------------------------------------

    @rehearsed
    def set_cooldown(
        self, scope: CooldownScope, target: str, duration_ms: int, reason: str | None
    ) -> CooldownChange:
        """A manual cooldown (R-POL-8); returns it and every cooldown that refuses the target."""
        with self.db.write() as txn:
            until = upsert_cooldown(
                txn.conn,
                txn.now,
                scope,
                target,
                txn.now + duration_ms,
                "manual",
                CooldownOrigin.MANUAL,
                reason,
            )
            blocking = blocking_cooldowns(txn.conn, txn.now, scope, target)
            return CooldownChange(txn.now, scope, target, blocking, manual_until_ms=until)

    @rehearsed
    def clear_cooldown(self, scope: CooldownScope, target: str, force: bool) -> CooldownChange:
        """Remove manual cooldowns on a target (all origins with force); says what still refuses."""
        origins: tuple[CooldownOrigin, ...] = (CooldownOrigin.MANUAL,)
        if force:
            origins = (CooldownOrigin.MANUAL, CooldownOrigin.POLICY, CooldownOrigin.HINT)
        with self.db.write() as txn:
            removed = clear_cooldowns(txn.conn, scope, target, origins)
            if force:  # cleared by hand: the target ends without a recovery probe (R-POL-9)
                probes.disarm(txn.conn, scope, target)
            blocking = blocking_cooldowns(txn.conn, txn.now, scope, target)
            return CooldownChange(txn.now, scope, target, blocking, removed=removed)


_TOKEN_KEYS = {
    (Window.ROLLING_MINUTE, Measure.TOKENS): "tokensPerMinute",
    (Window.ROLLING_MINUTE, Measure.INPUT_TOKENS): "inputTokensPerMinute",
    (Window.ROLLING_MINUTE, Measure.OUTPUT_TOKENS): "outputTokensPerMinute",
    (Window.ROLLING_DAY, Measure.TOKENS): "tokensPerDay",
}


def token_detail(budget: Budget | None) -> str:
    """A token window's refusal names its target and limit (R-TOK-2), e.g. `tokensPerMinute
    1000 of provider alpha`; "" for every other budget."""
    name = None if budget is None else _TOKEN_KEYS.get((budget.window, budget.measure))
    if budget is None or name is None:
        return ""
    to = budget.applies_to
    return f"{name} {budget.limit} of {to.dimension.value} {to.name}"


def _granted(verdict: Reservation | budgets.Refusal, now: int) -> Reservation:
    """A reservation, or its refusal raised with the reason code (after the commit)."""
    if isinstance(verdict, budgets.Refusal):
        scope = verdict.scope
        raise Refused(
            str(verdict.reason),
            token_detail(verdict.budget)
            or verdict.detail
            or ("" if scope is None else f"scope {scope}"),
            retry_at_ms=verdict.retry_at_ms,
            now_ms=now,
            scope=scope,
        )
    return verdict


@rehearsed
def _alone(db: Database, step: Step[Any]) -> Answered[Any]:
    """One step in a transaction of its own (a ledger with no database yet is rehearsed)."""
    try:
        return write_steps(db, [step])[0]
    except LedgerError as error:
        return Answered(error=error)


def _resumed(lease_owner: str | None, lease_expires_ms: int | None, now: int) -> dict[str, Any]:
    """Resume keeps the counters (R-RES-3) and never releases a live lease: a source a worker
    still holds stays `leased` (claimable only at lease expiry), not `queued`."""
    if lease_owner is not None and lease_expires_ms is not None and lease_expires_ms > now:
        return {"state": SourceState.LEASED.value, "pause_reason": None}
    return {
        "state": SourceState.QUEUED.value,
        "pause_reason": None,
        "lease_owner": None,
        "lease_expires_ms": None,
    }
