"""Admission: the reserve's verdict for one model (R-RES-1..9 in the SPEC's order).

Pure: the budget state the store read in the reserve transaction, the policy and the model in; a
`Grant` or the first failing check's `Refusal` out. It joins the budgets with the privacy boundary
of route rules (`routing.rules.boundary_reason`), so it sits above both.
"""

from __future__ import annotations

from ledger.budgets.checks import BudgetState, Grant, Refusal, ceiling_micro
from ledger.catalog import Model
from ledger.config import Policy
from ledger.kinds import RefusalReason, SourceState
from ledger.routing.rules import boundary_reason


def check(
    state: BudgetState,
    policy: Policy,
    model: Model,
    estimate: int | None,
    *,
    override: bool = False,
    immediate: bool = False,
    primary: str | None = None,
    retry: bool = False,
) -> Grant | Refusal:
    """Run the checks of R-RES-1..9 in the SPEC's order; the first failing one refuses.

    `immediate` marks the one follow-up a queue item may make right after a failure (R-POL-4):
    the backoff that very failure set delays the source's *next* queue item, not its permitted
    immediate fallback (otherwise a transport failure's fallback could never run).
    `primary` is the source's primary model: every other model is a backup, held to the privacy
    boundary of route rules, crossProviderFallback and fallbackModels (checked after R-RES-3;
    nothing, override included, skips it).
    `retry` marks the one same-model retry an interactive request's failure permitted (R-GW-4):
    the model cooldown that failure set (a short supplied wait, already waited) does not block it.
    """
    now = state.now_ms
    src = state.source
    # R-RES-1: nothing bypasses the shared hourly budget
    if state.hourly_count >= policy.calls_per_hour:
        return Refusal(RefusalReason.SHARED_HOURLY_BUDGET, state.hourly_next_free_ms)
    # R-RES-2: nothing bypasses the daily ceiling; unknown prices fail closed
    ceiling = ceiling_micro(policy)
    if ceiling is not None:
        if estimate is None:
            return Refusal(RefusalReason.UNKNOWN_PRICE)
        if state.daily_cost_micro + estimate > ceiling:
            # when room frees needs the window's rows: the store reads them for a refusal only
            # and fills in `ceiling_frees_at` (reading them on every reserve would cost a grant)
            return Refusal(RefusalReason.DAILY_COST_CEILING)
    # R-RES-3: a settled source is never rerun; a paused one waits for resume
    if src.state == SourceState.DONE:
        return Refusal(RefusalReason.SOURCE_SETTLED)
    if src.state == SourceState.PAUSED:
        return Refusal(RefusalReason.SOURCE_PAUSED)
    boundary = boundary_reason(policy, model.key, primary or model.key, src.models)
    if boundary is not None:  # the privacy boundary, exactly as selection applies it
        return Refusal(RefusalReason(boundary.value))
    if override:  # R-RES-9: skips R-RES-4..8, deadline is then timeoutMs
        return Grant(now + policy.timeout_ms, estimate)
    # R-RES-4
    if not immediate and src.retry_at_ms is not None and src.retry_at_ms > now:
        return Refusal(RefusalReason.SOURCE_BACKOFF, src.retry_at_ms)
    # R-RES-5
    if state.provider_cooldown_until is not None and state.provider_cooldown_until > now:
        return Refusal(RefusalReason.PROVIDER_COOLDOWN, state.provider_cooldown_until)
    if not retry and state.model_cooldown_until is not None and state.model_cooldown_until > now:
        return Refusal(RefusalReason.MODEL_COOLDOWN, state.model_cooldown_until)
    if state.probe_held_until is not None and state.probe_held_until > now:
        return Refusal(RefusalReason.PROBING, state.probe_held_until)
    # R-RES-6
    if src.calls >= policy.source_calls:
        return Refusal(RefusalReason.SOURCE_CALLS)
    # R-RES-7
    if model.key not in src.models and len(src.models) + 1 > policy.source_models:
        return Refusal(RefusalReason.SOURCE_MODELS)
    # R-RES-8: the deadline is per attempt, clamped to what the source has left
    left = policy.source_time_ms - src.time_used_ms
    if left <= 0:
        return Refusal(RefusalReason.SOURCE_TIME)
    return Grant(now + min(policy.timeout_ms, left), estimate)
