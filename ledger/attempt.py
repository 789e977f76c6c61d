"""The attempt protocol the worker (R-POL-4) and the gateway (R-GW-2, R-GW-4) share: plan ->
reserve -> call -> classify -> settle -> follow-up, every attempt its own reservation.

Each driver keeps only its pace and its transport (the worker: a sync `WorkerLedger`, a lease and
a handler; the gateway: the group committer, an upstream exchange, the interactive pace). What
an attempt is and how it ends is here, in one place:

- `AttemptPlan`: which model, in which role, after which failed reservation (the reserve
  request); `AttemptPlan.primary` for a first attempt, `plan_follow_up` for the one next attempt
  a settle result permits (the corrective prompt, the interactive same-model retry, or the first
  route the selector offers under the failure's fallback constraint).
- `success`, `failed`, `cancelled`: the provider's usage -> the outcome settled, built here only.
- `overran`: the deadline check on the caller's own clock (R-HTTP-3, R-RES-11).
- `Attempt`: the one record of an attempt, from its reservation to its settle; `AttemptReport`
  is what a settled worker attempt leaves in the drain's summary.

Invariant: a reservation is settled exactly once. `Attempt.settling` hands out its one outcome
and refuses a second (`SettledTwice`); `settle` / `settle_async` are the only paths from an
attempt to its transport's settle. The drivers settle on every path their call can take:
success, classified failure, an exception (classified by type) and a cancel (R-Q-4, R-GW-7).
The follow-up is only ever one the settle result permitted (the policy table decided it in the
settle transaction and stored it on the failed reservation, which `reserve(after=)` checks
again). No I/O here but the `routes` callable a caller hands `plan_follow_up` (its selection
read) and the `send` callable it hands `settle`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ledger.classify import Classification
from ledger.kinds import AttemptRole, FailureKind
from ledger.learned import LearnedLimits
from ledger.records import Cancelled, Failed, Outcome, Reservation, SettleResult, Success

__all__ = [
    "Attempt",
    "AttemptObserver",
    "AttemptPlan",
    "AttemptReport",
    "RoutesAfter",
    "SettledTwice",
    "Usage",
    "cancelled",
    "failed",
    "overran",
    "plan_follow_up",
    "reported",
    "settle",
    "settle_async",
    "success",
]


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class AttemptPlan:
    """One attempt's reserve request: which route, in which role, after which failed
    reservation (None: a first attempt), and what the call is told (the broken rule a
    corrective prompt names, the interactive wait before a same-model retry)."""

    route: str
    role: AttemptRole = AttemptRole.PRIMARY
    after: int | None = None
    fallback_from: str | None = None
    correction_reason: str | None = None
    wait_ms: int = 0
    """Interactive pace: wait this long before the same-model retry (R-GW-4)."""

    @classmethod
    def primary(cls, route: str) -> AttemptPlan:
        """A first attempt on `route` chosen by the selection (or named by the caller)."""
        return cls(route)


RoutesAfter = Callable[[FailureKind | None, str, frozenset[str]], Sequence[str]]
"""(failure kind, failed model, models tried) -> the eligible routes, best first."""


def plan_follow_up(
    settled: SettleResult, failed_model: str, tried: frozenset[str], routes: RoutesAfter
) -> AttemptPlan | None:
    """The permitted follow-up of `settled` (a failed attempt on `failed_model`), or None."""
    after = settled.reservation_id
    if settled.use_correction:
        reason = settled.reason or settled.subkind
        return AttemptPlan(failed_model, AttemptRole.CORRECTION, after, correction_reason=reason)
    if settled.retry_after_ms is not None:
        return AttemptPlan(failed_model, AttemptRole.RETRY, after, wait_ms=settled.retry_after_ms)
    if settled.fallback is None:
        return None
    kind = FailureKind(settled.kind) if settled.kind else None
    offered = routes(kind, failed_model, tried | {failed_model})
    if not offered:
        return None
    return AttemptPlan(offered[0], AttemptRole.FALLBACK, after, fallback_from=failed_model)


# --------------------------------------------------------------------------- usage -> outcome


class Usage(Protocol):
    """The token counts a call reported (a provider response, a handler result, a stream's
    tracker): any may be unknown."""

    @property
    def input_tokens(self) -> int | None: ...

    @property
    def output_tokens(self) -> int | None: ...

    @property
    def cache_write_tokens(self) -> int | None: ...

    @property
    def cache_read_tokens(self) -> int | None: ...


def success(
    usage: Usage | None,
    *,
    cost_usd: float | None = None,
    estimated: bool = False,
    limits: LearnedLimits | None = None,
) -> Success:
    """A usable answer with the usage it reported (None: none at all). `estimated`: the call
    reported no usable usage, so it is settled at its estimate and marked `usage_estimated`,
    never as free (R-GW-5). `limits`: the token limits its headers reported (R-TOK-4)."""
    if usage is None:
        return Success(cost_usd=cost_usd, usage_estimated=estimated, limits=limits)
    return Success(
        usage.input_tokens,
        usage.output_tokens,
        cost_usd,
        cache_write_tokens=usage.cache_write_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        usage_estimated=estimated,
        limits=limits,
    )


def reported(usage: Usage, cost_usd: float | None) -> bool:
    """A reply reported usage: a token count or a cost (else it is settled at its estimate)."""
    return not (usage.input_tokens is None and usage.output_tokens is None and cost_usd is None)


def failed(
    classification: Classification,
    usage: Usage | None = None,
    *,
    side_effects: bool = False,
    limits: LearnedLimits | None = None,
) -> Failed:
    """A classified failure with the usage the failed call reported, if any, and the token
    limits its headers reported (R-TOK-4)."""
    if usage is None:
        return Failed(classification, side_effects=side_effects, limits=limits)
    return Failed(
        classification,
        side_effects=side_effects,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        limits=limits,
    )


def cancelled(
    usage: Usage | None = None, *, estimated: bool = False, limits: LearnedLimits | None = None
) -> Cancelled:
    """A cancelled call (a stop request, a caller that left, a deadline): no failure is added,
    the slot counts; the usage seen before the cut, if any (R-Q-4, R-GW-7, R-GW-5b), and the
    token limits the answer's headers reported (R-TOK-4)."""
    if usage is None:
        return Cancelled(usage_estimated=estimated, limits=limits)
    return Cancelled(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        usage_estimated=estimated,
        limits=limits,
    )


def overran(now_ms: int, reservation: Reservation) -> bool:
    """The call outlived its reservation's deadline by the caller's own clock (R-HTTP-3): it is
    settled late, whatever the store's clock says (R-RES-11). The worker measures its call on
    its call clock (another process may hold the ledger); the gateway settles in the ledger's
    own process and clock, where the store's check at the settle is that measure."""
    return now_ms > reservation.deadline_ms


# --------------------------------------------------------------------------- the record

P = TypeVar("P")
T = TypeVar("T")


class AttemptObserver(Protocol):
    """Told of an attempt's one settle (the tracing seam's span, R-OTEL-1)."""

    def settled(self, attempt: Attempt[Any]) -> None: ...


class SettledTwice(RuntimeError):
    """A second settle of one attempt's reservation: a driver bug, never an outcome."""


@dataclass(frozen=True)
class AttemptReport:
    """One settled attempt of a queue item, as the drain's summary counts it."""

    reservation_id: int
    model: str
    role: AttemptRole
    kind: str | None  # None on success
    late: bool = False
    subkind: str | None = None


@dataclass(eq=False)
class Attempt(Generic[P]):
    """One attempt from its reservation to its settle: its number in the request or queue item,
    the route called (a pool's concrete pick, R-RT-5), the route the first attempt took, and the
    driver's prepared call (`P`: the gateway's upstream request; the worker has none)."""

    number: int
    route: str
    reservation: Reservation
    first_route: str
    prepared: P
    outcome: Outcome | None = None
    settled: SettleResult | None = None
    observer: AttemptObserver | None = field(default=None, repr=False)
    """Told when the attempt is settled (`ledger.telemetry.watch`; None: not traced)."""

    @property
    def role(self) -> AttemptRole:
        """Primary, fallback, correction or retry, as the reservation recorded it."""
        return self.reservation.role

    @property
    def fallback_from(self) -> str | None:
        """The model the first attempt took, when another answered (R-GW-6)."""
        return self.first_route if self.route != self.first_route else None

    def headers(self) -> dict[str, str]:
        """R-GW-6: which model answered, after how many attempts, under which reservation."""
        out = {
            "x-ledger-model": self.route,
            "x-ledger-attempts": str(self.number),
            "x-ledger-reservation": str(self.reservation.id),
        }
        if self.fallback_from is not None:
            out["x-ledger-fallback-from"] = self.fallback_from
        return out

    def settling(self, outcome: Outcome) -> Outcome:
        """Claim this attempt's one settle with `outcome` (a second claim raises)."""
        if self.outcome is not None:
            raise SettledTwice(f"reservation {self.reservation.id} is settled already")
        self.outcome = outcome
        return outcome

    def record(self, settled: SettleResult) -> SettleResult:
        """What the settle recorded and the actions the policy table applied."""
        self.settled = settled
        if self.observer is not None:
            self.observer.settled(self)
        return settled

    def report(self) -> AttemptReport:
        """The settled attempt as the drain's summary counts it."""
        settled = self.settled
        if isinstance(self.outcome, Cancelled) or settled is None:
            return AttemptReport(
                self.reservation.id, self.route, self.role, FailureKind.CANCELLED.value
            )
        if isinstance(self.outcome, Success):
            return AttemptReport(self.reservation.id, self.route, self.role, None, settled.late)
        return AttemptReport(
            self.reservation.id, self.route, self.role, settled.kind, settled.late,
            settled.subkind,
        )  # fmt: skip


def settle(
    attempt: Attempt[P], outcome: Outcome, send: Callable[[int, Outcome], SettleResult]
) -> SettleResult:
    """Settle the attempt once through a synchronous transport (`send(reservation_id, outcome)`)."""
    return attempt.record(send(attempt.reservation.id, attempt.settling(outcome)))


async def settle_async(
    attempt: Attempt[P], outcome: Outcome, send: Callable[[int, Outcome], Awaitable[SettleResult]]
) -> SettleResult:
    """Settle the attempt once through an asynchronous transport (the gateway's group commit)."""
    return attempt.record(await send(attempt.reservation.id, attempt.settling(outcome)))
