"""The status document's response models (R-DIAG-2: `GET /v1/status`, `ledger status --json`),
mirroring `ledger.status.document.build_status` field by field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ledger.service.answers import Answer, CooldownOut, ExclusionOut


class HealthOut(Answer):
    """Health of one provider or model (R-DIAG-6)."""

    scope: str
    target: str
    state: str
    cooling_until: str | None
    probe_until: str | None
    consecutive_failures: int
    last_failure_kind: str | None
    last_failure_at: str | None
    last_success_at: str | None
    attempts_1h: int
    failures_1h: int
    probe_streak: int


class HourlyOut(Answer):
    used: int
    limit: int
    next_free_at: str | None


class DailyOut(Answer):
    window_hours: int
    attempts: int
    spent_usd: float
    ceiling_usd: float | None
    unknown_cost_attempts: int
    input_tokens: int
    output_tokens: int
    cache_write_tokens: int
    cache_read_tokens: int


class DayOut(Answer):
    day: str
    attempts: int
    succeeded: int
    failed: int
    input_tokens: int
    output_tokens: int
    cache_write_tokens: int
    cache_read_tokens: int
    spent_usd: float
    unknown_cost_attempts: int


class SourceSummaryOut(Answer):
    id: str
    state: str
    calls: int
    models: list[str]
    failures: int
    output_failures: int
    time_used_ms: int
    open_allowance_ms: int
    pause_reason: str | None
    retry_at: str | None
    lease_expires: str | None


class SourcesBlockOut(Answer):
    counts: dict[str, int]
    list: list[SourceSummaryOut]


class RecentOut(Answer):
    id: int
    time: str | None
    source: str
    model: str
    role: str
    status: str
    kind: str | None
    subkind: str | None
    duration_ms: int | None
    late: bool


class OutcomeOut(Answer):
    provider: str
    model: str
    status: str
    kind: str | None
    count: int


class HourOut(Answer):
    start: str | None
    end: str | None
    attempts: int
    succeeded: int
    failed: dict[str, int]
    other: int
    spent_usd: float
    unknown_cost_attempts: int


class QueuedOut(Answer):
    id: str
    state: str
    last_checked: str | None
    retry_at: str | None
    lease_expires: str | None
    waits: Literal[
        "leased", "retry_later", "no_route", "hourly_budget", "daily_ceiling", "waiting_for_worker"
    ]


class QueueOut(Answer):
    due_now: int
    next_due_at: str | None
    oldest: list[QueuedOut]


class FailoverOut(Answer):
    time: str | None
    source: str
    from_: str | None = Field(alias="from")
    to: str
    kind: str | None
    status: str


class NoticeOut(Answer):
    category: str
    message: str
    source: str | None
    first: str | None
    last: str | None
    count: int


class StoreOut(Answer):
    backend: str
    sqlite_library: str | None = None  # pysqlite3 (bundled) or sqlite3 (R-DB-3c)
    sqlite_version: str | None
    journal_mode: str | None
    journal_mode_chosen: str | None
    revision: str | None
    network_filesystem: str | None


class WriterOut(Answer):
    fingerprint: str
    last_seen: str | None
    reservations: int
    current: bool
    live: bool  # issue 33: another policy's process that still writes (ledger/status.py)


class PolicyOut(Answer):
    fingerprint: str
    writers: list[WriterOut]
    warning: str | None


class InertOut(Answer):
    field: str
    reason: str
    message: str


class ScopeHourlyOut(Answer):
    used: int
    limit: int | None
    next_free_at: str | None


class ScopeDailyOut(Answer):
    spent_usd: float
    ceiling_usd: float | None


class ScopeInFlightOut(Answer):
    open: int
    limit: int | None
    next_free_at: str | None


class ScopeOut(Answer):
    """One scope's use against its limits (R-SC-2); a limit it does not set is null."""

    name: str
    hourly: ScopeHourlyOut
    daily: ScopeDailyOut
    in_flight: ScopeInFlightOut
    full: list[str]  # R-DIAG-1: the limits it is at (hourly, daily, in_flight)


class RefusalCountOut(Answer):
    """The last hour's refusals for one reason, scope and gateway key (R-DIAG-1)."""

    reason: str
    scope: str | None
    key: str | None
    count: int
    last_minute: str | None


class RefusalsOut(Answer):
    """Refusals answered by a service in the last hour (R-DIAG-1)."""

    window_minutes: int
    total: int
    by: list[RefusalCountOut]


class TokenBudgetOut(Answer):
    """One configured token window's use against its limit (R-TOK-5)."""

    target: str | None  # a provider, model key or glob; null for a scope's window
    scope: str | None
    kind: str  # provider, model, glob or scope
    window: str  # tokensPerMinute, inputTokensPerMinute, outputTokensPerMinute, tokensPerDay
    limit: int
    used: int
    frees_at: str | None  # when its first counted part leaves the window


class LearnedLimitOut(Answer):
    """One live reading of a provider's token limit (R-TOK-4)."""

    model: str
    kind: str  # tokens, input_tokens or output_tokens
    remaining: int  # what the provider's answer reported left
    left: int  # what is left for the next reservation: less the estimates granted since
    limit: int | None
    read_at: str | None
    resets_at: str | None


class StatusOut(Answer):
    """The status document (`ledger status --json`, README "status --json")."""

    schema_: int = Field(alias="schema")
    now: str | None
    default_model: str | None
    routes: list[str]
    excluded: list[ExclusionOut]
    excluded_by_reason: dict[str, int]
    routes_retry_at: str | None
    cooldowns: list[CooldownOut]
    health: list[HealthOut]
    hourly: HourlyOut
    daily: DailyOut
    history: list[DayOut]
    sources: SourcesBlockOut
    recent: list[RecentOut]
    outcomes_24h: list[OutcomeOut]
    hours_24: list[HourOut]
    queue: QueueOut
    failovers: list[FailoverOut]
    notices: list[NoticeOut]
    store: StoreOut
    policy: PolicyOut
    inert: list[InertOut]
    warnings: list[str]
    scopes: list[ScopeOut]
    refusals: RefusalsOut
    token_budgets: list[TokenBudgetOut] = Field(default_factory=list)  # R-TOK-5
    learned_limits: list[LearnedLimitOut] = Field(default_factory=list)  # R-TOK-4
    service_elsewhere: bool  # a CLI's document while `ledger serve` runs on the state directory
    # R-RT-7: only when the policy has pools (strategy, cursor, candidates, live leases)
    pools: list[dict[str, Any]] | None = None
