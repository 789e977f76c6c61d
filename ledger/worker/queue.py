"""Pure helpers of the queue and worker (R-POL-4, R-Q-3): handler results, classification of what
a handler reports, item outcomes, the drain summary, its exit code and its progress line.

Invariant: nothing here does I/O or reads a clock (time comes in as `now_ms`); a classification
is built only from status, headers, a bounded error body, stop enums, exception types or an
explicit kind and reason token — never from provider prose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from ledger.attempt import AttemptReport
from ledger.budgets.checks import SPENT_REASONS
from ledger.classify import (
    Classification,
    classify_exception,
    classify_http,
    classify_kind,
    classify_stop_reason,
)
from ledger.kinds import AttemptRole, FailureKind, RefusalReason
from ledger.providers.base import INVALID_RESPONSE, ProviderResponse

GLOBAL_REFUSALS = frozenset(
    {
        RefusalReason.SHARED_HOURLY_BUDGET.value,
        RefusalReason.DAILY_COST_CEILING.value,
    }
)
"""Refusals that hold for every source alike: a drain pass stops claiming when it meets one."""
SPENT_REFUSALS = frozenset(reason.value for reason in SPENT_REASONS)
"""Refusals of a source that used a cap of its own: it is paused with the reason on release."""


@dataclass(frozen=True)
class HandlerResult:
    """What a handler reports about its one call: ok with usage, or the facts of a failure.

    A failure is either a `response` (raw ProviderResponse facts, classified by the worker) or an
    explicit `kind` (+ `reason` token, e.g. invalid_output / "json_contract"). `commit` is called by
    the worker only when the result is accepted — a success settled in time (R-RES-11) by a
    worker that still holds its lease; the source is finished only after `commit` returned.
    """

    ok: bool
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    response: ProviderResponse | None = None
    kind: FailureKind | None = None
    reason: str | None = None
    side_effects: bool = False
    commit: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    cache_write_tokens: int | None = None
    cache_read_tokens: int | None = None

    @classmethod
    def success(
        cls,
        response: ProviderResponse | None = None,
        *,
        commit: Callable[[], None] | None = None,
    ) -> HandlerResult:
        """A usable result; usage is taken from `response` when given."""
        if response is None:
            return cls(ok=True, commit=commit)
        return cls(
            ok=True,
            input_tokens=response.input_tokens,
            output_tokens=response.output_tokens,
            cost_usd=response.cost_usd,
            commit=commit,
            cache_write_tokens=response.cache_write_tokens,
            cache_read_tokens=response.cache_read_tokens,
        )

    @classmethod
    def failed_call(
        cls, response: ProviderResponse, *, side_effects: bool = False
    ) -> HandlerResult:
        """A failed call, described by the adapter's raw facts."""
        return cls(
            ok=False,
            input_tokens=response.input_tokens,
            output_tokens=response.output_tokens,
            response=response,
            side_effects=side_effects,
            cache_write_tokens=response.cache_write_tokens,
            cache_read_tokens=response.cache_read_tokens,
        )

    @classmethod
    def failure(
        cls,
        kind: FailureKind,
        reason: str | None = None,
        *,
        response: ProviderResponse | None = None,
        side_effects: bool = False,
    ) -> HandlerResult:
        """An explicit failure kind, e.g. invalid_output with reason `json_contract`."""
        return cls(
            ok=False,
            input_tokens=None if response is None else response.input_tokens,
            output_tokens=None if response is None else response.output_tokens,
            cache_write_tokens=None if response is None else response.cache_write_tokens,
            cache_read_tokens=None if response is None else response.cache_read_tokens,
            kind=kind,
            reason=reason,
            side_effects=side_effects,
        )


def classify_response(response: ProviderResponse, now_ms: int) -> Classification | None:
    """The policy-table row for an adapter's facts, or None when the call is usable."""
    if response.exception is not None:
        return classify_exception(response.exception)
    if response.status is not None and not 200 <= response.status < 300:
        return classify_http(response.status, response.headers, response.error_body, now_ms)
    if response.stop_reason == INVALID_RESPONSE:
        return Classification(FailureKind.INVALID_OUTPUT, INVALID_RESPONSE)
    stop = classify_stop_reason(response.stop_reason)
    if stop is not None:
        return stop
    if not response.ok:
        return Classification(FailureKind.UNKNOWN, "call_failed")
    return None


def classify_result(result: HandlerResult, now_ms: int) -> Classification:
    """Classify a handler's failure report (an explicit kind wins over response facts)."""
    if result.kind is not None:
        return classify_kind(result.kind, result.reason)
    if result.response is not None:
        found = classify_response(result.response, now_ms)
        if found is not None:
            return found
    return Classification(FailureKind.UNKNOWN, "handler_failed")


class ItemOutcome(StrEnum):
    """How one queue item ended."""

    DONE = "done"  # a result was accepted; the source is finished
    FAILED = "failed"  # every attempt failed; the source waits (backoff, cooldown or next pass)
    PAUSED = "paused"  # the policy table (R-POL-5) or an operator paused the source
    REFUSED = "refused"  # the first reservation was refused (budget, cooldown, source limits)
    UNROUTABLE = "unroutable"  # no eligible route right now (R-POL-6)
    LATE = "late"  # a success arrived after its deadline and was not used (R-RES-11)
    CANCELLED = "cancelled"  # SIGINT/SIGTERM during the call (R-Q-4)
    LOST_LEASE = "lost_lease"  # the lease expired and another worker took the source
    COMMIT_FAILED = "commit_failed"  # the commit raised: a failure with backoff, not finished


@dataclass(frozen=True)
class ItemReport:
    """The record of one queue item: claim, at most two immediate attempts, release."""

    source_id: str
    outcome: ItemOutcome
    attempts: tuple[AttemptReport, ...] = ()
    refusal: str | None = None
    retry_at_ms: int | None = None
    """When a refusal or an unroutable selection says work may become possible again."""
    scope: str | None = None
    """The scope whose budget refused the item's first reservation (R-SC-1), if one did."""

    @property
    def reserved(self) -> bool:
        """True when at least one reservation was granted in this item."""
        return bool(self.attempts)

    @property
    def fallback(self) -> bool:
        """True when the item made an immediate fallback attempt."""
        return any(a.role is AttemptRole.FALLBACK for a in self.attempts)

    @property
    def correction(self) -> bool:
        """True when the item made a corrective attempt."""
        return any(a.role is AttemptRole.CORRECTION for a in self.attempts)


SHOWN_FAILURES = 4  # failure reasons named in the text summary, most frequent first


@dataclass
class DrainSummary:
    """Counters of one `worker run` (mutable while draining, reported at the end)."""

    items: int = 0
    done: int = 0
    failed: int = 0
    paused: int = 0
    refused: int = 0
    budget_refused: int = 0
    unroutable: int = 0
    late: int = 0
    cancelled: int = 0
    lost_lease: int = 0
    commit_failed: int = 0
    attempts: int = 0
    fallbacks: int = 0
    corrections: int = 0
    stopped_by_signal: bool = False
    refusals: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    """Failed attempts by `kind/subkind on provider` (issue 33: why, not only how many)."""

    def add(self, item: ItemReport) -> None:
        """Count one finished item."""
        self.items += 1
        self.attempts += len(item.attempts)
        self.fallbacks += item.fallback
        self.corrections += item.correction
        for attempt in item.attempts:
            if attempt.kind is not None and attempt.kind != "cancelled":
                provider = attempt.model.partition("/")[0]
                reason = f"{attempt.kind}/{attempt.subkind or '-'} on {provider}"
                self.failures[reason] = self.failures.get(reason, 0) + 1
        counter = item.outcome.value  # every outcome has a counter of the same name
        setattr(self, counter, getattr(self, counter) + 1)
        if item.refusal is not None:
            self.refusals[item.refusal] = self.refusals.get(item.refusal, 0) + 1
            if item.refusal in GLOBAL_REFUSALS:
                self.budget_refused += 1

    def exit_code(self) -> int:
        """R-Q-3: 0 worked or nothing due; 3 when everything claimed was refused before a call."""
        if self.items == 0 or self.attempts > 0 or self.cancelled or self.stopped_by_signal:
            return 0
        return 3 if self.refused + self.unroutable == self.items else 0

    def progress_line(self) -> str:
        """One short line for a terminal whose outcome counts add up to the items."""
        if self.items == 0:
            return "[worker] nothing due"
        outcomes = [
            f"{self.done} done",
            *(
                f"{n} {label}"
                for n, label in (
                    (self.failed, "failed (retry later)"),
                    (self.paused, "paused"),
                    (self.refused, "refused"),
                    (self.unroutable, "unroutable (no eligible route)"),
                    (self.late, "late"),
                    (self.cancelled, "cancelled"),
                    (self.lost_lease, "lost lease"),
                    (self.commit_failed, "commit failed (retry later)"),
                )
                if n
            ),
        ]
        reasons = sorted(self.failures.items(), key=lambda r: (-r[1], r[0]))
        why = ", ".join(f"{n}x {reason}" for reason, n in reasons[:SHOWN_FAILURES])
        if len(reasons) > SHOWN_FAILURES:  # the rest are in --json `failures`
            why += f" and {len(reasons) - SHOWN_FAILURES} more"
        return (
            f"[worker] {plural(self.items, 'item')}: {', '.join(outcomes)}; "
            f"{plural(self.fallbacks, 'fallback')}, {plural(self.corrections, 'correction')}"
            + (f"; failed calls: {why}" if why else "")
        )

    def to_json(self) -> dict[str, object]:
        """JSON shape printed by `ledger worker run --json`."""
        return {
            "items": self.items,
            "done": self.done,
            "failed": self.failed,
            "paused": self.paused,
            "refused": self.refused,
            "unroutable": self.unroutable,
            "late": self.late,
            "cancelled": self.cancelled,
            "lost_lease": self.lost_lease,
            "commit_failed": self.commit_failed,
            "attempts": self.attempts,
            "fallbacks": self.fallbacks,
            "corrections": self.corrections,
            "refusals": dict(sorted(self.refusals.items())),
            "failures": dict(sorted(self.failures.items())),
            "stopped_by_signal": self.stopped_by_signal,
            "exit_code": self.exit_code(),
        }


def plural(n: int, noun: str) -> str:
    """`1 item`, `2 items`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
