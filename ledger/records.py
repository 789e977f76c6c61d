"""Plain result and outcome types shared by the store, the API and the CLI."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ledger.classify import Classification
from ledger.clock import iso
from ledger.errors import UsageError
from ledger.kinds import AttemptRole, AttemptStatus
from ledger.learned import LearnedLimits

MAX_TOKENS = 10**12
"""The largest token count accepted in reported usage (CLI and API alike)."""
MAX_COST_USD = 1e9
"""The largest provider-reported cost accepted, in USD."""


def plausible_tokens(value: object) -> bool:
    """An integer token count in 0..MAX_TOKENS (never negative: R-RES-2)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS


def plausible_cost_usd(value: object) -> bool:
    """A finite USD amount in 0..MAX_COST_USD."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and 0 <= value <= MAX_COST_USD


def check_tokens(value: object) -> None:
    """Reported token counts are absent or plausible (API and CLI; adapters drop the rest)."""
    if value is not None and not plausible_tokens(value):
        raise UsageError(f"token counts must be integers from 0 to {MAX_TOKENS}")


def check_usage(outcome: Success | Failed | Cancelled) -> None:
    """Every reported token count of an outcome is absent or plausible."""
    for value in (
        outcome.input_tokens,
        outcome.output_tokens,
        outcome.cache_write_tokens,
        outcome.cache_read_tokens,
    ):
        check_tokens(value)


def check_cost_usd(value: object) -> None:
    """A reported cost is absent or plausible (API and CLI; adapters drop the rest)."""
    if value is not None and not plausible_cost_usd(value):
        raise UsageError("a cost must be a finite non-negative amount")


def check_limits(value: object) -> None:
    """Learned limits (R-TOK-4) are absent or a `LearnedLimits` (ledger.learned.read_limits)."""
    if value is not None and not isinstance(value, LearnedLimits):
        raise UsageError("limits must be LearnedLimits (ledger.learned.read_limits)")


def micro_to_usd(micro: int | None) -> float | None:
    """Micro-USD as a float USD amount for display."""
    return None if micro is None else micro / 1_000_000


@dataclass(frozen=True)
class Reservation:
    """Permission for exactly one provider call, for one source on one model, with a deadline."""

    id: int
    source: str
    model: str
    created_ms: int
    deadline_ms: int
    estimate_micro: int | None
    role: AttemptRole
    status: AttemptStatus
    request_id: str | None = None
    replayed: bool = False  # True when an earlier reservation with the same request id came back
    pool: str | None = None  # the pool the concrete `model` was chosen from (R-RT-4)
    effort: str | None = None  # this route's reasoning effort (R-RT-2); None: provider default
    # R-TOK-2: the token estimate its token windows count until it settles with usage
    estimate_input_tokens: int = 0
    estimate_output_tokens: int = 0

    @property
    def estimate_tokens(self) -> int:
        """Input and reply estimate together (what `tokensPerMinute` counts)."""
        return self.estimate_input_tokens + self.estimate_output_tokens

    def to_json(self) -> dict[str, Any]:
        """JSON shape printed by `ledger reserve --json`."""
        return {
            "id": self.id,
            "source": self.source,
            "model": self.model,
            "created": iso(self.created_ms),
            "deadline": iso(self.deadline_ms),
            "estimate_usd": micro_to_usd(self.estimate_micro),
            "role": self.role.value,
            "status": self.status.value,
            "request_id": self.request_id,
            "replayed": self.replayed,
            "pool": self.pool,
            "effort": self.effort,
            "estimate_tokens": self.estimate_tokens,
            "estimate_input_tokens": self.estimate_input_tokens,
            "estimate_output_tokens": self.estimate_output_tokens,
        }


@dataclass(frozen=True)
class Success:
    """The call returned a usable answer (usage as reported; any may be unknown).

    `input_tokens` are the prompt tokens billed at the input price; prompt-cache writes and reads
    come on top of them (Anthropic's own reading; from OpenAI's `prompt_tokens`, subtract the
    cached tokens). Unreported cache counts are taken as none.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    finish: bool = False
    cache_write_tokens: int | None = None
    cache_read_tokens: int | None = None
    usage_estimated: bool = False
    """The call reported no usage (a stream without it, R-GW-5): settled at its estimate and
    marked `usage_estimated`, never as free."""
    limits: LearnedLimits | None = None
    """The token limits the provider reported on this answer (R-TOK-4), stored by the settle."""

    def __post_init__(self) -> None:
        """Usage is validated here, so the API refuses what the CLI refuses (never a raw error)."""
        check_usage(self)
        check_limits(self.limits)
        check_cost_usd(self.cost_usd)
        if not isinstance(self.finish, bool):
            raise UsageError("finish must be True or False")
        if not isinstance(self.usage_estimated, bool):
            raise UsageError("usage_estimated must be True or False")


@dataclass(frozen=True)
class Cancelled:
    """The call was cancelled (shutdown, reload, a caller that left): no failure is added; the
    slot still counts.

    Usage seen before the cut (a gateway stream's `message_start`, R-GW-7) may be given: it is
    recorded, and the cost is the actual one only when both token counts are known, else the
    reservation's estimate, marked `usage_estimated` (never less than the call may have cost)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_read_tokens: int | None = None
    usage_estimated: bool = False
    """The cost is the estimate because the usage seen is incomplete or none (R-GW-7)."""
    limits: LearnedLimits | None = None
    """The token limits the provider reported before the cut (R-TOK-4)."""

    def __post_init__(self) -> None:
        """Usage is validated as for a success."""
        check_usage(self)
        check_limits(self.limits)
        if not isinstance(self.usage_estimated, bool):
            raise UsageError("usage_estimated must be True or False")

    @property
    def usage_seen(self) -> bool:
        """Some token count was reported."""
        return any(
            v is not None
            for v in (self.input_tokens, self.output_tokens, self.cache_write_tokens,
                      self.cache_read_tokens)
        )  # fmt: skip


@dataclass(frozen=True)
class Failed:
    """The call failed, as classified by ledger.classify."""

    classification: Classification
    side_effects: bool = False
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_read_tokens: int | None = None
    limits: LearnedLimits | None = None
    """The token limits the provider reported on its failed answer (R-TOK-4)."""

    def __post_init__(self) -> None:
        """Usage is validated as for a success; the classification must be one (classify_*)."""
        if not isinstance(self.classification, Classification):
            raise UsageError("a failure needs a Classification (from ledger.classify)")
        if not isinstance(self.side_effects, bool):
            raise UsageError("side_effects must be True or False")
        check_usage(self)
        check_limits(self.limits)


Outcome = Success | Cancelled | Failed


@dataclass(frozen=True)
class SettleResult:
    """What settling recorded and every action the policy table applied."""

    reservation_id: int
    source: str
    model: str
    status: AttemptStatus
    late: bool
    kind: str | None = None
    subkind: str | None = None
    reason: str | None = None
    actions: tuple[str, ...] = ()
    fallback: str | None = None  # the FallbackConstraint permitted, if any
    use_correction: bool = False
    retry_after_ms: int | None = None  # interactive pace: one same-model retry after this wait
    paused: str | None = None
    finished: bool = False
    cost_micro: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def must_not_commit(self) -> bool:
        """R-RES-11: a late result may have been billed but must not be used by the caller."""
        return self.late

    def to_json(self) -> dict[str, Any]:
        """JSON shape printed by `ledger settle --json`."""
        return {
            "reservation": self.reservation_id,
            "source": self.source,
            "model": self.model,
            "status": self.status.value,
            "late": self.late,
            "must_not_commit": self.must_not_commit,
            "kind": self.kind,
            "subkind": self.subkind,
            "reason": self.reason,
            "actions": list(self.actions),
            "fallback": {"constraint": self.fallback} if self.fallback else None,
            "correction": self.use_correction,
            "paused": self.paused,
            "finished": self.finished,
            "cost_usd": micro_to_usd(self.cost_micro),
        }


@dataclass(frozen=True)
class SourceStateChange:
    """What `pause` / `resume` / `done` left a source in: its state, whether it already was
    paused (a second pause writes nothing and keeps the policy's reason, issue 29 item 13) and
    its pause reason."""

    source: str
    state: str
    already: bool = False
    pause_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON shape printed by `ledger source pause|resume|done --json` and the /v1 API."""
        return {
            "source": self.source,
            "state": self.state,
            "already": self.already,
            "pause_reason": self.pause_reason,
        }
