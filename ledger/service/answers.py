"""The service's response bodies: models that mirror the library's `to_json()` shapes exactly.

Extra fields are forbidden and tests/test_service.py validates the library's output against them,
so the OpenAPI document and the CLI's `--json` cannot drift apart. The status document's models
are in `status_schema`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ledger.kinds import AttemptRole


class Answer(BaseModel):
    """A response document: exactly the library's JSON shape."""

    model_config = ConfigDict(extra="forbid")


class ErrorDetail(Answer):
    """What went wrong: a reason code (refusals) or error name, and one fixed line; a refusal
    also says when to retry (`retry_at`, ISO 8601 UTC) or, when waiting does not help, what
    clears it (`hint`), as the CLI's `--json` does."""

    code: str
    message: str
    retry_at: str | None = None
    scope: str | None = None  # the scope that refused (R-SC-1)
    hint: str | None = None


class ErrorOut(Answer):
    """Every error answer: `{"error": {"code", "message"[, "retry_at", "hint"]}}`."""

    error: ErrorDetail


class ReservationOut(Answer):
    """`Reservation.to_json()` (as `ledger reserve --json`)."""

    id: int
    source: str
    model: str
    created: str
    deadline: str
    estimate_usd: float | None
    role: AttemptRole
    status: str
    request_id: str | None
    replayed: bool
    pool: str | None = None
    effort: str | None = None
    estimate_tokens: int = 0  # R-TOK-2: input and reply estimate, what token windows count
    estimate_input_tokens: int = 0
    estimate_output_tokens: int = 0


class FallbackOut(Answer):
    """The fallback a failure permits."""

    constraint: str


class SettleOut(Answer):
    """`SettleResult.to_json()` (as `ledger settle --json`)."""

    reservation: int
    source: str
    model: str
    status: str
    late: bool
    must_not_commit: bool
    kind: str | None
    subkind: str | None
    reason: str | None
    actions: list[str]
    fallback: FallbackOut | None
    correction: bool
    paused: str | None
    finished: bool
    cost_usd: float | None


class ExclusionOut(Answer):
    """One excluded model and the first rule that excluded it."""

    model: str
    reason: str
    until: str | None = None
    credential_env: str | None = None
    base_url_missing: bool | None = None


class SelectionOut(Answer):
    """`Selection.to_json()` (as `ledger select --json`)."""

    routes: list[str]
    excluded: list[ExclusionOut]
    excluded_by_reason: dict[str, int]
    retry_at: str | None
    chain: dict[str, Any] | None = None  # the chain the primary matched and why (R-RT-1)
    targets: list[dict[str, Any]] = Field(default_factory=list)  # each route's effort, pool
    pools: list[dict[str, Any]] = Field(default_factory=list)  # pool routes' candidates


class CooldownOut(Answer):
    """One active cooldown (`cooldown list --json`, status `cooldowns`)."""

    scope: str
    target: str
    until: str | None
    remaining_s: float
    kind: str
    origin: str
    reason: str | None


class CooldownsOut(Answer):
    """`ledger cooldown list --json`."""

    cooldowns: list[CooldownOut]


class CooldownChangeOut(Answer):
    """The target, the cooldown in force (null fields when none) and every one that refuses it."""

    scope: str
    target: str
    until: str | None
    remaining_s: float | None
    kind: str | None
    origin: str | None
    cooldowns: list[CooldownOut]


class ManualCooldownOut(Answer):
    """The manual row `cooldown set` wrote (never shortened)."""

    until: str
    remaining_s: float
    reason: str | None


class CooldownSetOut(CooldownChangeOut):
    """`ledger cooldown set --json`."""

    manual: ManualCooldownOut


class CooldownClearOut(CooldownChangeOut):
    """`ledger cooldown clear --json`: what is left, and how many rows were removed."""

    removed: int


class SourceOut(Answer):
    """One row of `ledger source list --json`."""

    id: str
    state: str
    in_worker_queue: bool
    calls: int
    failures: int
    output_failures: int
    retry_at: str | None
    last_checked: str | None
    lease_owner: str | None
    lease_expires: str | None
    correction_used: bool
    pause_reason: str | None
    finished: str | None


class SourcesOut(Answer):
    """`ledger source list --json`."""

    sources: list[SourceOut]


class AttemptOut(Answer):
    """One attempt of a source's failover history (R-DIAG-5)."""

    id: int
    created: str | None
    model: str
    role: str
    fallback: bool
    correction: bool
    override: bool
    fallback_from: str | None
    immediate: bool
    after: int | None
    permits: str | None
    status: str
    kind: str | None
    subkind: str | None
    reason: str | None
    late: bool
    duration_ms: int | None
    deadline: str | None
    input_tokens: int | None
    output_tokens: int | None
    cache_write_tokens: int | None
    cache_read_tokens: int | None
    estimate_usd: float | None
    cost_usd: float | None


class SourceDetailOut(SourceOut):
    """`ledger source show --json`: counters plus the whole failover history."""

    models: list[str]
    time_used_ms: int
    open_allowance_ms: int
    open_reservations: int
    backoff_steps: int
    correction_reason: str | None
    attempts: list[AttemptOut]


class SourceAddOut(Answer):
    """`ledger source add`: whether the source was new, and whether it is queued."""

    source: str
    created: bool
    queued: bool


class SourceStateOut(Answer):
    """`ledger source pause|resume|done`: the state the source is in now; `already` when a pause
    found it paused (its reason kept)."""

    source: str
    state: str
    already: bool
    pause_reason: str | None


class CorrectionOut(Answer):
    """A correction the claimed source is owed (R-POL-4)."""

    model: str
    reason: str | None


class OwedFallbackOut(Answer):
    """A fallback the claimed source is owed after a failure on `failed_model`."""

    failed_model: str
    tried: list[str]
    deferred: bool


class ClaimedOut(Answer):
    """A source leased to one worker until `lease_expires_ms` (R-Q-2)."""

    source: str
    payload_ref: str | None
    worker_id: str
    claimed_ms: int
    lease_expires_ms: int
    correction: CorrectionOut | None
    owed_fallback: OwedFallbackOut | None


class ClaimOut(Answer):
    """`claim`: the lease, or null when nothing is due."""

    claim: ClaimedOut | None


class HeldOut(Answer):
    """`renew`, `finish`, `release`: false when the lease was lost (or, renew, paused)."""

    held: bool


class ReleaseSpentOut(Answer):
    """`release_spent`: the pause reason when the source used its cap, else null."""

    paused: str | None


class DeferOut(Answer):
    """`defer_owed_fallback`: the new retry time (ms), null when the lease was lost."""

    retry_at_ms: int | None


class CommitFailedOut(Answer):
    """`commit_failed`: the backoff applied, or `held: false` when the lease was lost."""

    held: bool
    retry_at_ms: int | None
    paused: str | None


class QueueTimesOut(Answer):
    """`queue_times`: ledger time now and when queued work next becomes due (ms)."""

    now_ms: int
    next_retry_ms: int | None
    next_lease_expiry_ms: int | None


class CompactOut(Answer):
    """`compact`: the attempts folded into daily totals by this step."""

    folded: int


class HealthzOut(Answer):
    """The process answers."""

    status: Literal["ok"]


class ReadyOut(Answer):
    """The database is reachable and at the head revision."""

    status: Literal["ready"]
    revision: str
