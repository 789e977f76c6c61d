"""The policy file `recovery.json` (R-CFG-1..5): a strict model that fails closed, never echoing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)

from ledger.clock import parse_duration_ms
from ledger.errors import UsageError
from ledger.targets import EFFORT_LEVELS, routing_problem
from ledger.validation import (
    TAG,
    Derived,
    Printable,
    load_document,
    located,
    parse_document,
)

POLICY_FILE = "recovery.json"

_MODEL_KEY = r"^[^/\s]{1,100}/[^\s]{1,200}$"
_GLOB = r"^[^\s]{1,300}$"

PositiveInt = Annotated[int, Field(gt=0, le=10**12)]
MIN_LEASE_MS = 1000
"""The shortest lease a worker's heartbeat can keep: it renews every leaseMs/4 (250 ms at the
floor), each renewal a write transaction that may wait its turn for the write lock."""
# SQLite's busy timeout and PostgreSQL's lock_timeout are 32-bit signed milliseconds (~24.8 days):
# beyond that SQLite silently waited 0 ms and PostgreSQL refused the connection.
BUSY_TIMEOUT_MAX_MS = 2**31 - 1
ModelKey = Annotated[str, Field(pattern=_MODEL_KEY), Printable]
Glob = Annotated[str, Field(pattern=_GLOB), Printable]


class RouteRules(BaseModel):
    """Anchored globs over model keys (R-SEL-9): deny wins; a non-empty allow admits only those."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[Glob] = Field(default_factory=list, max_length=1000)
    deny: list[Glob] = Field(default_factory=list, max_length=1000)


EffortLevel = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
assert get_args(EffortLevel) == EFFORT_LEVELS  # one list of levels (R-RT-2)
PoolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")]
MAX_TIER = 100


class TargetSpec(BaseModel):
    """A chain entry with a reasoning effort for that route only (R-RT-2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelKey
    effort: EffortLevel | None = None


class CandidateSpec(BaseModel):
    """A pool candidate with its tier (0 first) and effort (R-RT-4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelKey
    tier: Annotated[int, Field(ge=0, le=MAX_TIER)] = 0
    effort: EffortLevel | None = None


class StickyFor(BaseModel):
    """`{"for": DURATION}`: stick to the candidate until DURATION after it was first chosen."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    for_: Annotated[str, Field(max_length=40)] = Field(alias="for")

    @field_validator("for_")
    @classmethod
    def _duration(cls, value: str) -> str:
        try:
            parse_duration_ms(value)
        except UsageError:
            raise ValueError("rule: must be a duration such as 30m or 1h30m") from None
        return value

    @property
    def ms(self) -> int:
        """The duration in milliseconds."""
        return parse_duration_ms(self.for_)


def _entry_kind(value: object) -> str:
    """A key string, or an object with `model` (a union decided by the JSON type, so an error
    names the object's own field rather than 'must be a string')."""
    return TAG + ("key" if isinstance(value, str) else "spec")


CandidateEntry = Annotated[
    Annotated[ModelKey, Tag(TAG + "key")] | Annotated[CandidateSpec, Tag(TAG + "spec")],
    Discriminator(_entry_kind),
]
TargetEntry = Annotated[
    Annotated[ModelKey, Tag(TAG + "key")] | Annotated[TargetSpec, Tag(TAG + "spec")],
    Discriminator(_entry_kind),
]

Strategy = Literal["primary", "round-robin", "random", "least-used"]
StickyMode = Literal["off", "on", "while-cached"]


class PoolSpec(BaseModel):
    """One pool (R-RT-4..6): candidates behind one virtual model, a strategy, stickiness."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    candidates: list[CandidateEntry] = Field(min_length=1, max_length=1000)
    strategy: Strategy = "primary"
    sticky: Annotated[
        Annotated[StickyMode, Tag(TAG + "key")] | Annotated[StickyFor, Tag(TAG + "spec")],
        Discriminator(_entry_kind),
    ] = "off"
    sticky_scope: Literal["source", "pool"] = Field("source", alias="stickyScope")


SCOPE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
"""A scope name (R-SC-1): short and plain, so a refusal can name it without echoing anything odd."""
ScopeName = Annotated[str, Field(pattern=SCOPE_NAME)]
MAX_SCOPES = 1000


TokenCount = Annotated[int, Field(strict=True, gt=0, le=10**12)]
"""A token limit: a whole positive number (1.5, 0, -1 and 10**13 are configuration errors)."""


class TokenLimits(BaseModel):
    """Token-rate budgets of one target or scope (R-TOK-1): any of the four windows."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    tokens_per_minute: TokenCount | None = Field(None, alias="tokensPerMinute")
    input_tokens_per_minute: TokenCount | None = Field(None, alias="inputTokensPerMinute")
    output_tokens_per_minute: TokenCount | None = Field(None, alias="outputTokensPerMinute")
    tokens_per_day: TokenCount | None = Field(None, alias="tokensPerDay")


TokenTarget = Annotated[str, Field(pattern=r"^[^\s]{1,300}$"), Printable]
"""A provider name, a model key (with `/`) or a glob over model keys (with `*` or `?`)."""


class ScopeLimits(TokenLimits):
    """One scope's budgets (R-SC-1): any of them, each checked like its global counterpart,
    and the token windows of R-TOK-1."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    calls_per_hour: PositiveInt | None = Field(None, alias="callsPerHour")
    daily_estimated_usd: Annotated[float, Field(gt=0, le=10**9, allow_inf_nan=False)] | None = (
        Field(None, alias="dailyEstimatedUsd")
    )
    in_flight: PositiveInt | None = Field(None, alias="inFlight")


class GatewayPolicy(BaseModel):
    """The gateway's pace and stream bounds (R-GW-4, R-GW-5); every key optional."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    max_retry_wait_ms: Annotated[int, Field(ge=0, le=10**9)] = Field(3000, alias="maxRetryWaitMs")
    retry_backoff_ms: Annotated[int, Field(ge=0, le=10**9)] = Field(500, alias="retryBackoffMs")
    max_attempts_per_request: Annotated[int, Field(gt=0, le=100)] = Field(
        4, alias="maxAttemptsPerRequest"
    )
    first_token_ms: PositiveInt = Field(30_000, alias="firstTokenMs")
    idle_ms: PositiveInt = Field(30_000, alias="idleMs")


class Policy(BaseModel):
    """The whole recovery policy; every key optional, defaults as in SPEC section 4."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    cross_provider_fallback: bool = Field(True, alias="crossProviderFallback")
    fallback_models: list[ModelKey] = Field(
        default_factory=list, alias="fallbackModels", max_length=1000
    )
    calls_per_hour: PositiveInt = Field(20, alias="callsPerHour")
    source_calls: PositiveInt = Field(4, alias="sourceCalls")
    source_models: PositiveInt = Field(2, alias="sourceModels")
    timeout_ms: PositiveInt = Field(120_000, alias="timeoutMs")
    source_time_ms: PositiveInt = Field(300_000, alias="sourceTimeMs")
    daily_estimated_usd: Annotated[float, Field(gt=0, le=10**9, allow_inf_nan=False)] | None = (
        Field(None, alias="dailyEstimatedUsd")
    )
    # keys of ours (R-CFG-1: optional, documented defaults)
    default_model: ModelKey | None = Field(None, alias="defaultModel")
    reply_tokens: PositiveInt = Field(4096, alias="replyTokens")
    routes: RouteRules = Field(default_factory=RouteRules)
    busy_timeout_ms: Annotated[int, Field(gt=0, le=BUSY_TIMEOUT_MAX_MS)] = Field(
        10_000, alias="busyTimeoutMs"
    )
    lease_ms: Annotated[int, Field(ge=MIN_LEASE_MS, le=10**12)] = Field(360_000, alias="leaseMs")
    retention_days: PositiveInt = Field(30, alias="retentionDays")
    # routing (SPEC section 18)
    chains: dict[Glob, list[TargetEntry]] = Field(default_factory=dict, max_length=10_000)
    default_chain: list[TargetEntry] | None = Field(None, alias="defaultChain", max_length=1000)
    pools: dict[PoolName, PoolSpec] = Field(default_factory=dict, max_length=10_000)
    # what routing, the API and the gateway work out from this (frozen) policy, made on first use
    _derived: Derived = PrivateAttr(default_factory=Derived)
    scopes: Annotated[dict[ScopeName, ScopeLimits], Field(max_length=MAX_SCOPES)] = Field(
        default_factory=dict
    )
    gateway: GatewayPolicy = Field(default_factory=GatewayPolicy)
    # token-rate budgets (SPEC section 22)
    token_budgets: dict[TokenTarget, TokenLimits] = Field(
        default_factory=dict, alias="tokenBudgets", max_length=10_000
    )
    # R-TOK-4: the token limits providers report on their answers are learned and kept to
    learn_limits: bool = Field(True, alias="learnLimits")

    @field_validator("token_budgets")
    @classmethod
    def _no_pool_targets(cls, value: dict[str, TokenLimits]) -> dict[str, TokenLimits]:
        for name in value:
            if name.startswith("pool/"):
                raise ValueError("rule: a token budget's target is a provider, a model key or "
                                 "a glob over model keys, never a pool")
        return value

    @field_validator("fallback_models")
    @classmethod
    def _no_duplicates(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("rule: must not contain duplicate entries")
        return value

    @model_validator(mode="after")
    def _routing_consistent(self) -> Policy:
        problem = routing_problem(self)
        if problem is not None:
            raise located(*problem)
        return self

    @property
    def derived(self) -> Derived:
        """This policy's cache of derived values (a reloaded policy has its own, empty one)."""
        return self._derived

    def fingerprint(self) -> str:
        """A short stable hash of the effective policy (R-HOME-3: shows stale processes).

        A key added in a later release counts only once set: an upgrade alone changes no
        policy's fingerprint, so it does not mark every running process stale."""
        document = self.to_json()
        for name, default in _LATER_KEYS.items():
            if document.get(name) == default:
                document.pop(name, None)
        return fingerprint_of(document)

    def to_json(self) -> dict[str, Any]:
        """The effective policy as camelCase JSON data."""
        return self.model_dump(by_alias=True, mode="json")


_LATER_KEYS: dict[str, Any] = {"tokenBudgets": {}, "learnLimits": True}
"""Keys added after fingerprints were first shown, with their defaults: fingerprinted only when
set to something else."""


def fingerprint_of(document: dict[str, Any]) -> str:
    """Hash of a canonical JSON rendering."""
    canon = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def parse_policy(text: str | bytes, file: str = POLICY_FILE) -> Policy:
    """Validate policy text or raise ConfigError (fail closed)."""
    return parse_document(Policy, text, file)


def load_policy(home: Path) -> Policy:
    """Read `recovery.json` from the state directory; a missing file means all defaults."""
    return load_document(Policy, home / POLICY_FILE)


def policy_schema() -> dict[str, Any]:
    """The JSON Schema of recovery.json (R-CFG-5)."""
    schema = Policy.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ledger recovery.json"
    return schema
