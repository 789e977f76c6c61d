"""Plain result and outcome types shared by the store, the API and the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger.classify import Classification
from ledger.clock import iso
from ledger.kinds import AttemptRole, AttemptStatus


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
        }


@dataclass(frozen=True)
class Success:
    """The call returned a usable answer (usage as reported; any may be unknown)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    finish: bool = False


@dataclass(frozen=True)
class Cancelled:
    """The call was cancelled (shutdown, reload): no failure is added; the slot still counts."""


@dataclass(frozen=True)
class Failed:
    """The call failed, as classified by ledger.classify."""

    classification: Classification
    side_effects: bool = False
    input_tokens: int | None = None
    output_tokens: int | None = None


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
