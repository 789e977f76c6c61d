"""The policy file `recovery.json` (R-CFG-1..5): a strict model that fails closed, never echoing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ledger.validation import Printable, load_document, parse_document

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
    gateway: GatewayPolicy = Field(default_factory=GatewayPolicy)

    @field_validator("fallback_models")
    @classmethod
    def _no_duplicates(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("rule: must not contain duplicate entries")
        return value

    def fingerprint(self) -> str:
        """A short stable hash of the effective policy (R-HOME-3: shows stale processes)."""
        return fingerprint_of(self.to_json())

    def to_json(self) -> dict[str, Any]:
        """The effective policy as camelCase JSON data."""
        return self.model_dump(by_alias=True, mode="json")


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
