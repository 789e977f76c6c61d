"""Admission: the reserve's verdict for one model (R-RES-1..9 in the SPEC's order).

Pure: the budgets that apply, their use and the gates the store read in the reserve transaction,
the policy and the model in; a `Grant` or the first failing check's `Refusal` out. The budgets
are checked by `ledger.budgets.unit.check` at their stage of the order: the shared ones with
R-RES-1..2, a source's with R-RES-6..8, the scopes' after every check of section 7 (R-SC-1). It
joins them with the privacy boundary of route rules (`routing.rules.boundary_reason`), so it sits
above both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ledger.budgets import unit
from ledger.budgets.checks import Grant, Refusal, SourceBudget
from ledger.budgets.unit import Budget, Stage, UsageKey, Use
from ledger.catalog import Model
from ledger.config import Policy
from ledger.kinds import RefusalReason, SourceState
from ledger.routing.rules import boundary_reason


@dataclass(frozen=True)
class BudgetState:
    """Everything the checks need, read inside the reserving transaction."""

    asked: unit.Request  # what the reservation takes of each measure, and `now`
    budgets: Mapping[Stage, Sequence[Budget]]  # the budgets that apply (unit.applicable)
    usage: Mapping[UsageKey, Use]  # each one's use
    source: SourceBudget
    provider_cooldown_until: int | None
    model_cooldown_until: int | None
    probe_held_until: int | None = None  # R-POL-9: another reservation is the probe until then


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
    now = state.asked.now_ms
    src = state.source
    # R-RES-1, R-RES-2: nothing bypasses the shared hourly budget and the daily ceiling; unknown
    # prices fail closed. A rolling cost window's refusal leaves its retry time to the store,
    # which reads the window's rows for a refusal only (on every reserve they would cost a grant)
    refused = _stage(state, Stage.SHARED)
    if refused is not None:
        return refused
    # R-RES-3: a settled source is never rerun; a paused one waits for resume
    if src.state == SourceState.DONE:
        return Refusal(RefusalReason.SOURCE_SETTLED)
    if src.state == SourceState.PAUSED:
        return Refusal(RefusalReason.SOURCE_PAUSED)
    boundary = boundary_reason(policy, model.key, primary or model.key, src.models)
    if boundary is not None:  # the privacy boundary, exactly as selection applies it
        return Refusal(RefusalReason(boundary.value))
    if override:  # R-RES-9: skips R-RES-4..8 (a provider's token limit is never skipped)
        refused = _stage(state, Stage.SCOPE) or _stage(state, Stage.TOKENS)
        return refused or Grant(now + policy.timeout_ms, estimate)
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
    # R-RES-6..8: the source's calls, models and time
    refused = _stage(state, Stage.SOURCE)
    if refused is not None:
        return refused
    # R-SC-1: every scope's budgets, after every check above
    refused = _stage(state, Stage.SCOPE)
    if refused is not None:
        return refused
    # R-TOK-2: every token window of the model's provider, the model and the globs it matches
    refused = _stage(state, Stage.TOKENS)
    if refused is not None:
        return refused
    # R-RES-8: the deadline is per attempt, clamped to what the source has left
    left = policy.source_time_ms - src.time_used_ms
    return Grant(now + min(policy.timeout_ms, left), estimate)


def _stage(state: BudgetState, stage: Stage) -> Refusal | None:
    """The first budget of `stage` the reservation does not fit, as its refusal."""
    return unit.check(state.budgets.get(stage, ()), state.usage, state.asked)
