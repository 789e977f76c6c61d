"""Reason codes, failure kinds and states: StrEnum values that appear verbatim in JSON and docs."""

from __future__ import annotations

from enum import StrEnum


class RefusalReason(StrEnum):
    """Why a reservation was refused (SPEC section 7, checked in this order)."""

    SHARED_HOURLY_BUDGET = "shared_hourly_budget"
    DAILY_COST_CEILING = "daily_cost_ceiling"
    UNKNOWN_PRICE = "unknown_price"
    SOURCE_SETTLED = "source_settled"
    SOURCE_PAUSED = "source_paused"
    DENIED_BY_ROUTE = "denied_by_route"
    NOT_IN_FALLBACK_LIST = "not_in_fallback_list"
    SOURCE_BACKOFF = "source_backoff"
    PROVIDER_COOLDOWN = "provider_cooldown"
    MODEL_COOLDOWN = "model_cooldown"
    PROBING = "probing"  # the cooldown ended and another reservation is the recovery probe
    SOURCE_CALLS = "source_calls"
    SOURCE_MODELS = "source_models"
    SOURCE_TIME = "source_time"
    # a pool (R-RT-5) none of whose candidates can be called at all (unavailable, no text, denied,
    # too small for the request): no amount of waiting helps
    NO_POOL_CANDIDATE = "no_pool_candidate"
    # R-SC-1: a scope's own budgets, checked after every check above
    SCOPE_HOURLY_BUDGET = "scope_hourly_budget"
    SCOPE_DAILY_COST = "scope_daily_cost"
    SCOPE_IN_FLIGHT = "scope_in_flight"
    # SPEC section 22: a token window of a provider, model, glob or scope (R-TOK-2)
    TOKEN_BUDGET = "token_budget"  # noqa: S105  (a reason code, not a secret)
    # R-TOK-4: what the provider reported left of its token limit does not fit the estimate
    PROVIDER_TOKENS_EXHAUSTED = "provider_tokens_exhausted"


class ExclusionReason(StrEnum):
    """Why the selector left a catalog model out (R-SEL-7)."""

    NO_BASE_URL = "no_base_url"  # no catalog baseUrl and none known for it: never defaulted
    UNAVAILABLE = "unavailable"
    NO_TEXT = "no_text"
    MODEL_KIND = "model_kind"  # R-FMT-3: a chat model for an embedding request, or the reverse
    DENIED_BY_ROUTE = "denied_by_route"
    PROVIDER_COOLDOWN = "provider_cooldown"
    MODEL_COOLDOWN = "model_cooldown"
    PROBING = "probing"  # R-POL-9: a recovery probe is in flight on the provider or the model
    SAME_PROVIDER = "same_provider"
    SIBLING_NOT_FOR_KIND = "sibling_not_for_kind"
    NOT_IN_FALLBACK_LIST = "not_in_fallback_list"
    SOURCE_MODELS = "source_models"
    ALREADY_TRIED = "already_tried"
    CONTEXT_TOO_SMALL = "context_too_small"
    UNKNOWN_PRICE = "unknown_price"
    # R-TOK-4: a token window (tokenBudgets) or the provider's learned limit has no room for
    # the request's estimate: a backup with room is preferred
    TOKEN_BUDGET = "token_budget"  # noqa: S105  (a reason code, not a secret)
    PROVIDER_TOKENS_EXHAUSTED = "provider_tokens_exhausted"


class FailureKind(StrEnum):
    """The rows of the error policy table (SPEC section 8)."""

    AUTH = "auth"
    QUOTA = "quota"
    RATE_LIMIT = "rate_limit"
    TRANSPORT = "transport"
    REQUEST_REJECTED = "request_rejected"
    INVALID_OUTPUT = "invalid_output"
    SAFETY = "safety"
    WRITE_REJECTED = "write_rejected"
    STALE = "stale"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


class AttemptStatus(StrEnum):
    """Where a reservation stands."""

    OPEN = "open"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class SourceState(StrEnum):
    """Queue states of a source (R-Q-1)."""

    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    PAUSED = "paused"


class CooldownScope(StrEnum):
    """What a cooldown covers."""

    PROVIDER = "provider"
    MODEL = "model"


class CooldownOrigin(StrEnum):
    """Who set a cooldown."""

    POLICY = "policy"
    MANUAL = "manual"
    HINT = "hint"


class FollowUp(StrEnum):
    """The one immediate follow-up a failed reservation permits (R-POL-4), stored on it."""

    FALLBACK = "fallback"  # another model
    CORRECTION = "correction"  # the same model, with a corrective prompt
    RETRY = "retry"  # the same model once more, at interactive pace (R-GW-4)


class AttemptRole(StrEnum):
    """Why an attempt happened inside its queue item (R-DIAG-5)."""

    PRIMARY = "primary"
    FALLBACK = "fallback"
    CORRECTION = "correction"
    OVERRIDE = "override"
    RETRY = "retry"  # the one same-model retry of an interactive (gateway) request, R-GW-4
