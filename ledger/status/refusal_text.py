"""What a refusal tells its reader: when to retry, or what clears it when waiting does not help.

Pure: a reason code and times in, fixed text out (never a configuration value or an id).
"""

from __future__ import annotations

import math

from ledger.clock import human_duration_ms, iso
from ledger.kinds import RefusalReason as R

# Refusals that no amount of waiting clears (their retry time is unknown): what does.
UNTIMED_HINTS: dict[str, str] = {
    R.DAILY_COST_CEILING: "this estimate alone exceeds dailyEstimatedUsd",
    R.UNKNOWN_PRICE: "the model has no known price and dailyEstimatedUsd is set",
    R.SOURCE_SETTLED: "a finished source is never rerun",
    R.SOURCE_PAUSED: "`ledger source resume SOURCE` resumes it",
    R.DENIED_BY_ROUTE: "the policy's route rules deny this model",
    R.NOT_IN_FALLBACK_LIST: "the policy does not allow this model as a backup for this source",
    R.SOURCE_CALLS: "the source used its sourceCalls; `ledger source evolve` makes one override",
    R.SOURCE_MODELS: "the source used its sourceModels; `ledger source evolve` makes one override",
    R.SOURCE_TIME: "the source used its sourceTimeMs; `ledger source evolve` makes one override",
    R.SCOPE_DAILY_COST: "this estimate alone exceeds the scope's dailyEstimatedUsd",
    R.TOKEN_BUDGET: "this request's token estimate alone exceeds the token limit",
}

# What a scope's refusal (R-SC-1) tells besides its retry time: nothing overrides a scope.
SCOPE_HINTS: dict[str, str] = {
    R.SCOPE_HOURLY_BUDGET: "the scope used its callsPerHour; a slot frees as the hour rolls on",
    R.SCOPE_DAILY_COST: "the scope's 24 h cost is at its dailyEstimatedUsd",
    R.SCOPE_IN_FLIGHT: (
        "the scope has inFlight reservations open; settling one frees a slot at once"
    ),
}


def retry_text(reason: str, retry_at_ms: int | None, now_ms: int | None) -> str:
    """`retry at <ISO> (in 1h59m)`, or what clears a refusal that waiting does not; a scope's
    refusal says what its limit is too."""
    scope_hint = SCOPE_HINTS.get(reason)
    if retry_at_ms is not None:
        left = "" if now_ms is None else f" (in {human_duration_ms(max(0, retry_at_ms - now_ms))})"
        return f"retry at {iso(retry_at_ms)}{left}" + (f": {scope_hint}" if scope_hint else "")
    if scope_hint and reason != R.SCOPE_DAILY_COST:
        return f"{scope_hint}; the ledger does not know when"
    hint = UNTIMED_HINTS.get(reason)
    return "waiting does not help" + (f": {hint}" if hint else "")


def gateway_refusal_text(reason: str, subject: str, wait_s: int | None, now_ms: int) -> str:
    """A gateway refusal's message (R-GW-6a): the reason, the scope or target that refused and
    the retry time, e.g. `refused: scope_hourly_budget for scope team-a; retry after
    2026-12-03T21:14:00Z (in 3600 s)`; the time is the Retry-After header's, to the second."""
    head = f"refused: {reason} for {subject}"
    if wait_s is None:
        return f"{head}; {retry_text(reason, None, None)}"
    at = math.ceil(now_ms / 1000) * 1000 + wait_s * 1000
    return f"{head}; retry after {str(iso(at))[:19]}Z (in {wait_s} s)"
