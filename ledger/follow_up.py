"""The follow-up after a failed attempt: the one decision the worker (R-POL-4) and the gateway
(R-GW-4) share, so there is no second copy of the retry and fallback logic.

Invariant: the follow-up is only ever one the settle result permitted (the policy table decided it
in the settle transaction and stored it on the failed reservation, which `reserve(after=)` checks
again): the corrective prompt on the same model, the interactive same-model retry, or the first
route the selector offers under the failure's fallback constraint. No I/O here but the `routes`
callable the caller hands in (its selection read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ledger.kinds import AttemptRole, FailureKind
from ledger.records import SettleResult

RoutesAfter = Callable[[FailureKind | None, str, frozenset[str]], Sequence[str]]
"""(failure kind, failed model, models tried) -> the eligible routes, best first."""


@dataclass(frozen=True)
class FollowUpPlan:
    """The next attempt a failure permits: where, in which role, after which reservation."""

    route: str
    role: AttemptRole
    after: int
    fallback_from: str | None = None
    correction_reason: str | None = None
    wait_ms: int = 0
    """Interactive pace: wait this long before the same-model retry (R-GW-4)."""


def plan_follow_up(
    settled: SettleResult, failed_model: str, tried: frozenset[str], routes: RoutesAfter
) -> FollowUpPlan | None:
    """The permitted follow-up of `settled` (a failed attempt on `failed_model`), or None."""
    after = settled.reservation_id
    if settled.use_correction:
        reason = settled.reason or settled.subkind
        return FollowUpPlan(failed_model, AttemptRole.CORRECTION, after, correction_reason=reason)
    if settled.retry_after_ms is not None:
        return FollowUpPlan(failed_model, AttemptRole.RETRY, after, wait_ms=settled.retry_after_ms)
    if settled.fallback is None:
        return None
    kind = FailureKind(settled.kind) if settled.kind else None
    offered = routes(kind, failed_model, tried | {failed_model})
    if not offered:
        return None
    return FollowUpPlan(offered[0], AttemptRole.FALLBACK, after, fallback_from=failed_model)
