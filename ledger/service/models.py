"""The service's request and response bodies: pydantic models over the library's names.

Requests refuse unknown fields and loose types (a string is never a number here). Responses are
documented by models that mirror the library's `to_json()` shapes exactly (extra fields forbidden;
tests/test_service.py validates the library's output against them), so the OpenAPI document and
the CLI's `--json` cannot drift apart.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ledger.arguments import MAX_INPUT_BYTES
from ledger.kinds import AttemptRole, FailureKind
from ledger.records import MAX_COST_USD, MAX_TOKENS

Id = Annotated[StrictInt, Field(ge=1, le=2**62)]
Tokens = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
# one strict number type (an int is accepted as a float, a bool or a string is not): the bounds
# then land on the schema itself, not on a branch of a union where JSON Schema ignores them
Usd = Annotated[float, Field(strict=True, ge=0, le=MAX_COST_USD, allow_inf_nan=False)]
Text = Annotated[StrictStr, Field(max_length=1000)]
Key = Annotated[StrictStr, Field(min_length=1, max_length=400)]


class Body(BaseModel):
    """A request body: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


class ReserveBody(Body):
    """`Ledger.reserve`: permission for one call, or a refusal with its reason code."""

    source: Key
    model: Key
    input_bytes: Annotated[StrictInt, Field(ge=0, le=MAX_INPUT_BYTES)] | None = None
    text: Annotated[StrictStr, Field(max_length=60_000)] | None = None
    request_id: Key | None = None
    override: StrictBool = False
    role: AttemptRole = AttemptRole.PRIMARY
    fallback_from: Key | None = None
    after: Id | None = None
    scopes: Annotated[list[Key], Field(max_length=100)] = []


class EvolveBody(Body):
    """`Ledger.evolve`: one explicit override attempt on a known source (R-RES-9)."""

    source: Key
    model: Key
    input_bytes: Annotated[StrictInt, Field(ge=0, le=MAX_INPUT_BYTES)] | None = None


class SuccessOutcome(Body):
    """The call returned a usable answer."""

    result: Literal["success"]
    input_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    cost_usd: Usd | None = None
    finish: StrictBool = False
    cache_write_tokens: Tokens | None = None
    cache_read_tokens: Tokens | None = None


class CancelledOutcome(Body):
    """The call was cancelled: no failure is added; the slot still counts."""

    result: Literal["cancelled"]


class FailedOutcome(Body):
    """A failure the caller classified (a row of the error policy table)."""

    result: Literal["failed"]
    kind: FailureKind
    subkind: Annotated[StrictStr, Field(max_length=64)] = "reported"
    reason: Annotated[StrictStr, Field(max_length=64)] | None = None
    retry_after_ms: Annotated[StrictInt, Field(ge=0, le=2**62)] | None = None
    reset_at_ms: Annotated[StrictInt, Field(ge=0, le=2**62)] | None = None
    side_effects: StrictBool = False
    input_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    cache_write_tokens: Tokens | None = None
    cache_read_tokens: Tokens | None = None


class HttpOutcome(Body):
    """A provider's HTTP error, classified by the service as `ledger settle --http-status` does."""

    result: Literal["http"]
    http_status: Annotated[StrictInt, Field(ge=100, le=599)]
    code: Annotated[StrictStr, Field(max_length=64)] | None = None
    retry_after: Annotated[StrictStr, Field(max_length=64)] | None = None
    side_effects: StrictBool = False


Outcome = Annotated[
    SuccessOutcome | CancelledOutcome | FailedOutcome | HttpOutcome,
    Field(discriminator="result"),
]


class SettleBody(Body):
    """`Ledger.settle`: record the outcome and apply the error policy table."""

    reservation: Id
    outcome: Outcome
    overran: StrictBool = False


class SelectBody(Body):
    """`Ledger.select`: ordered routes and every exclusion (reserves nothing)."""

    source: Key | None = None
    model: Key | None = None
    input_bytes: Annotated[StrictInt, Field(ge=0, le=MAX_INPUT_BYTES)] | None = None
    text: Annotated[StrictStr, Field(max_length=60_000)] | None = None
    after_failure: FailureKind | None = None
    failed_model: Key | None = None
    tried: Annotated[list[Key], Field(max_length=100)] = []


class CooldownBody(Body):
    """`ledger cooldown set TARGET DURATION`."""

    target: Key
    duration: Annotated[StrictStr, Field(max_length=64)]
    reason: Text | None = None


class SourceBody(Body):
    """`ledger source add`."""

    source: Key
    payload_ref: Text | None = None
    enqueue: StrictBool = True
    scopes: Annotated[list[Key], Field(max_length=100)] = []


class SourceStateBody(Body):
    """`ledger source pause|resume|done`."""

    source: Key


class ClaimBody(Body):
    """A worker asks for the next due source."""

    worker_id: Key
    checked_before: Annotated[StrictInt, Field(ge=0, le=2**62)] | None = None


class LeaseBody(Body):
    """A worker acts on a lease it holds."""

    source: Key
    worker_id: Key


class CommitFailedBody(LeaseBody):
    """The handler's commit raised after a successful call on `model`."""

    model: Key


class RenewBody(LeaseBody):
    """Extend a lease (to cover a call's deadline; `unpaused`: a paused source is not held)."""

    cover_until_ms: Annotated[StrictInt, Field(ge=0, le=2**62)] = 0
    unpaused: StrictBool = False


class CompactBody(Body):
    """One bounded compaction step."""

    batch: Annotated[StrictInt, Field(ge=1, le=100_000)] = 1000


# --------------------------------------------------------------------------- responses


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


# ----------------------------------------------------------------- the status document (R-DIAG-2)


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
    service_elsewhere: bool  # a CLI's document while `ledger serve` runs on the state directory
    # R-RT-7: only when the policy has pools (strategy, cursor, candidates, live leases)
    pools: list[dict[str, Any]] | None = None


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    ReserveBody,
    SuccessOutcome,
    CancelledOutcome,
    FailedOutcome,
    HttpOutcome,
    SettleBody,
    SelectBody,
    CooldownBody,
    SourceBody,
    SourceStateBody,
    ClaimBody,
    LeaseBody,
    RenewBody,
    CompactBody,
)


# ----------------------------------------------------------------- errors per operation (R-SRV-2)

ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "bad input: malformed JSON or a usage error (the message says which; exit code 2)",
    401: "over TCP without a valid bearer token (the unix socket needs none)",
    404: "no such reservation or source",
    405: "a path parameter with a line break matches no route of this operation",
    408: "the request body did not arrive in time (the connection is closed)",
    409: "refused by policy: `code` is the reason code, `retry_at` or `hint` says what next",
    413: "the request body is larger than 64 KiB",
    422: "a field of the wrong type, out of range, or unknown",
    503: "the service is stopping, or the database is busy, unreachable, too new or too old: retry",
}
GATE = (401, 503)
"""What the gate in front of every route can answer: no token over TCP; draining or stopped."""
WITH_BODY = (400, 408, 413, 422, *GATE)
"""A route that reads a JSON body: malformed, too slow, too large, invalid, plus the gate's."""
PATH_PARAM = (405,)
"""A route with a path parameter: the router's patterns do not match a line break in it."""


def errors(*statuses: int, json_ref: bool = False) -> dict[int | str, dict[str, Any]]:
    """The `responses` of an operation for the error statuses it can really return, each an
    `ErrorOut`. `json_ref`: for a route whose own answer is not JSON (the page, the metrics), the
    errors are declared as `application/json` explicitly rather than under the route's type."""
    if json_ref:
        schema = {"$ref": "#/components/schemas/ErrorOut"}
        return {
            status: {
                "description": ERROR_DESCRIPTIONS[status],
                "content": {"application/json": {"schema": schema}},
            }
            for status in sorted(statuses)
        }
    return {
        status: {"model": ErrorOut, "description": ERROR_DESCRIPTIONS[status]}
        for status in sorted(statuses)
    }


BEARER_SCHEME = "bearer"


def finish_openapi(doc: dict[str, Any]) -> dict[str, Any]:
    """The served OpenAPI document, made valid JSON Schema for generators: integer bounds as
    integers (FastAPI's document model turns them into floats, `maximum: 599.0`), and the bearer
    security scheme TCP requires (optional on the unix socket: `{}` is also allowed); FastAPI's
    default validation error shape, which this service never answers, is replaced by ErrorOut."""

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer":
                for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                    value = node.get(key)
                    if isinstance(value, float) and value.is_integer():
                        node[key] = int(value)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    components = doc.setdefault("components", {})
    # every validation error is answered as ErrorOut (errors.py), never FastAPI's default shape
    schemas = components.get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path in doc.get("paths", {}).values():
        for operation in path.values():
            answer = operation.get("responses", {}).get("422")
            if answer is not None:
                answer.update(errors(422, json_ref=True)[422])
    components.setdefault("securitySchemes", {})[BEARER_SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "TCP only (`ledger serve --listen`): $LEDGER_TOKEN or the `ledger.token` "
        "file in the state directory. The unix socket's file mode is its authentication.",
    }
    doc["security"] = [{BEARER_SCHEME: []}, {}]
    return doc
