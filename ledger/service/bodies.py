"""The service's request bodies: pydantic models over the library's names.

Requests refuse unknown fields and loose types (a string is never a number here); every body the
API reads is listed in REQUEST_MODELS (its validation errors are answered as ErrorOut).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ledger.arguments import MAX_INPUT_BYTES
from ledger.kinds import AttemptRole, FailureKind
from ledger.learned import MAX_REMAINING, LimitKind
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


Remaining = Annotated[StrictInt, Field(ge=0, le=MAX_REMAINING)]
Ms = Annotated[StrictInt, Field(ge=0, le=2**62)]


class LearnedLimitBody(Body):
    """One kind of the provider's token limit as its answer reported it."""

    kind: LimitKind
    remaining: Remaining
    reset_at_ms: Ms
    limit: Remaining | None = None


class LearnedLimitsBody(Body):
    """The token limits the provider reported on the answer, read at `read_at_ms` (ledger time):
    kept until their reset, so the next reservations on the model are held to them."""

    read_at_ms: Ms
    limits: Annotated[list[LearnedLimitBody], Field(min_length=1, max_length=3)]


class SuccessOutcome(Body):
    """The call returned a usable answer."""

    result: Literal["success"]
    input_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    cost_usd: Usd | None = None
    finish: StrictBool = False
    cache_write_tokens: Tokens | None = None
    cache_read_tokens: Tokens | None = None
    limits: LearnedLimitsBody | None = None


class CancelledOutcome(Body):
    """The call was cancelled: no failure is added; the slot still counts."""

    result: Literal["cancelled"]
    limits: LearnedLimitsBody | None = None


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
    limits: LearnedLimitsBody | None = None


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
    # none added under these scopes (their token window is full for the worker's pass)
    skip_scopes: Annotated[list[Key], Field(max_length=100)] = []


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
