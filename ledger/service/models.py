"""The service's request and response bodies: pydantic models over the library's names.

Requests refuse unknown fields and loose types (a string is never a number here). Responses are
documented by models that mirror the library's `to_json()` shapes exactly (extra fields forbidden;
tests/test_service.py validates the library's output against them), so the OpenAPI document and
the CLI's `--json` cannot drift apart.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from ledger.arguments import MAX_INPUT_BYTES
from ledger.kinds import AttemptRole, FailureKind
from ledger.records import MAX_COST_USD, MAX_TOKENS

Id = Annotated[StrictInt, Field(ge=1, le=2**62)]
Tokens = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
Usd = Annotated[StrictFloat | StrictInt, Field(ge=0, le=MAX_COST_USD, allow_inf_nan=False)]
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
    """What went wrong: a reason code (refusals) or error name, and one fixed line."""

    code: str
    message: str
    retry_at: str | None = None
    scope: str | None = None  # the scope that refused (R-SC-1)


class ErrorOut(Answer):
    """Every error answer: `{"error": {"code", "message"}}`."""

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


class SelectionOut(Answer):
    """`Selection.to_json()` (as `ledger select --json`)."""

    routes: list[str]
    excluded: list[ExclusionOut]
    excluded_by_reason: dict[str, int]
    retry_at: str | None
    chain: dict[str, Any] | None = None  # the chain the primary matched and why (R-RT-1)
    targets: list[dict[str, Any]] = Field(default_factory=list)  # each route's effort, pool
    pools: list[dict[str, Any]] = Field(default_factory=list)  # pool routes' candidates


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
