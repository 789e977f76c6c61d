"""One queue item of the worker (R-POL-4): the attempt protocol (ledger.attempt) driven over a
claimed source, at the queue's pace, with a handler as the transport.

One queue item is: claim a due source (one write transaction) → select → reserve → call (the
handler) → classify → settle → at most ONE more immediate attempt (a fallback the settle result
permits and the selector offers, or the single corrective prompt on the same model) → release.
Never more than two immediate attempts, no sleeping retry loops; waiting happens only between
drain passes and is bounded by the soonest retry time (capped). A source owed a corrective prompt
starts its item with it; one owed an alternate model (its 2nd output failure, SPEC 8) starts with
that fallback, or, when no alternate is eligible, gets the generic backoff (R-POL-3) before the
same model is probed again. ``after=`` is passed to reserve only for the immediate follow-up a
failure's decision permitted in this item (the correction on the same model, a fallback to
another one).

Leases (R-Q-2): after each reservation the lease is extended to cover the call's deadline
(whatever ``leaseMs`` is), and it is checked again just before ``commit``; a worker that lost it
never commits (outcome ``lost_lease``). While ``commit`` runs, a heartbeat renews the lease every
leaseMs/4 (each renewal its own short write transaction; leaseMs is at least 1 s, so a renewal
may wait for the write lock well before the lease could run out); a worker whose lease was lost
during the commit does not finish the source (outcome ``lost_lease``).

Invariant: every attempt that was reserved is settled exactly once (success, failure or
`Cancelled()` on SIGINT/SIGTERM), through the protocol's one settle (`ledger.attempt.settle`;
proven with the gateway's in tests/test_attempt_protocol.py), and every claimed lease is released
by its owner (R-Q-4).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from ledger.attempt import (
    Attempt,
    AttemptPlan,
    AttemptReport,
    cancelled,
    failed,
    overran,
    plan_follow_up,
    settle,
    success,
)
from ledger.catalog import Model
from ledger.classify import Classification, classify_exception
from ledger.clock import monotonic_s
from ledger.errors import Refused, UsageError
from ledger.kinds import AttemptRole, FailureKind, RefusalReason
from ledger.learned import LearnedLimits, read_limits
from ledger.providers.base import CallRequest, ProviderResponse
from ledger.providers.registry import adapter_for
from ledger.records import SettleResult
from ledger.store import queue as store_queue
from ledger.targets import Effort
from ledger.telemetry import watch
from ledger.worker.handler import Handler, Job, input_bytes
from ledger.worker.heartbeat import LeaseHeartbeat
from ledger.worker.port import WorkerLedger
from ledger.worker.queue import (
    SPENT_REFUSALS,
    HandlerResult,
    ItemOutcome,
    ItemReport,
    classify_result,
)
from ledger.worker.stop import CallCancelled, Stopper

__all__ = ["run_item"]


WorkerAttempt = Attempt[None]
"""An attempt of a queue item (the worker prepares no request: its handler makes the call)."""


@dataclass(frozen=True)
class _Step:
    """How one attempt left the queue item: its record (None: the reserve was refused) and what
    the item does next."""

    attempt: WorkerAttempt | None
    refused: Refused | None = None
    cancelled: bool = False
    accepted: bool = False
    lost_lease: bool = False
    commit_failed: bool = False
    paused: bool = False  # paused during the call or by a failed commit: the result was not taken
    retry_at_ms: int | None = None  # the backoff a failed commit set

    @property
    def settled(self) -> SettleResult | None:
        """What the attempt's settle recorded."""
        return None if self.attempt is None else self.attempt.settled


@dataclass
class _Heard:
    """The token limits the last answer of a job's calls reported (R-TOK-4), read on the call
    clock when it arrived: settled with the attempt, whatever the handler returns."""

    limits: LearnedLimits | None = None


def _caller(
    ledger: WorkerLedger, model: Model, clock: Callable[[], int]
) -> Callable[[CallRequest], ProviderResponse]:
    catalog = ledger.catalog

    def call(request: CallRequest) -> ProviderResponse:
        provider = catalog.provider_for_call(model.provider)  # never a default host (issue 13)
        return adapter_for(provider, ledger.env).call(request, now_ms=clock)

    return call


def _listener(
    ledger: WorkerLedger, clock: Callable[[], int], heard: _Heard
) -> Callable[[ProviderResponse], None]:
    """What `Job.observe` does with an answer: keep the token limits its headers report, read on
    the call clock as it arrives (none under `"learnLimits": false`)."""
    learn = ledger.policy.learn_limits

    def observe(response: ProviderResponse) -> None:
        if learn and response.headers:
            heard.limits = read_limits(response.headers, clock()) or heard.limits

    return observe


def _call_clock(wall: Callable[[], int]) -> Callable[[int], Callable[[], int]]:
    """Ledger time as this process sees it during one call (R-HTTP-3, issue 12 item 4).

    Started just before reserving; once the reservation's `created_ms` (ledger time) is known,
    the clock reads created_ms + the time elapsed since the start (the larger of the local wall
    clock's and the monotonic clock's progress, so neither a slow local clock, nor a ledger clock
    another process pushed ahead, nor a wall clock stepping back lengthens the call).
    """
    wall0, mono0 = wall(), monotonic_s()

    def from_created(created_ms: int) -> Callable[[], int]:
        def now() -> int:
            elapsed = max(wall() - wall0, int((monotonic_s() - mono0) * 1000))
            return created_ms + max(0, elapsed)

        return now

    return from_created


def _classify(result: HandlerResult, now_ms: int) -> Classification:
    try:
        return classify_result(result, now_ms)
    except UsageError:  # a handler reported a kind/reason outside the fixed sets
        return Classification(FailureKind.UNKNOWN, "bad_handler_result")


def _attempt(
    ledger: WorkerLedger,
    claim: store_queue.Claim,
    handler: Handler,
    stopper: Stopper,
    plan: AttemptPlan,
    size: int,
    number: int = 1,
) -> _Step:
    """Reserve, call the handler, classify and settle one attempt (exactly once: in time,
    late, failed, or `cancelled` when the lease is gone or a stop request cuts the call)."""
    started = _call_clock(ledger.clock_fn)
    try:
        reservation = ledger.reserve(
            claim.source_id, plan.route, input_bytes=size, role=plan.role,
            fallback_from=plan.fallback_from, after=plan.after,
        )  # fmt: skip
    except Refused as refusal:
        return _Step(None, refused=refusal)
    clock = started(reservation.created_ms)
    route = reservation.model  # through a pool (R-RT-4): the concrete candidate it chose
    attempt: WorkerAttempt = Attempt(number, route, reservation, route, None)
    model = ledger.model(route)
    max_tokens = model.reply_reservation(ledger.policy.reply_tokens)
    watch(attempt, model.provider, model.id, max_tokens)  # R-OTEL-1: ends at the one settle
    # the lease covers the whole call, whatever leaseMs is (issue 12 item 3)
    if not ledger.renew(
        claim.source_id, claim.worker_id, cover_until_ms=reservation.deadline_ms, unpaused=True
    ):  # lost or paused before the call: nothing is sent, no failure added, the slot counts
        settle(attempt, cancelled(), ledger.settle)
        held = _still_held(ledger, claim)
        return _Step(attempt, lost_lease=not held, paused=held)
    job = Job(
        source_id=claim.source_id,
        payload_ref=claim.payload_ref,
        route=route,
        model=model,
        deadline_ms=reservation.deadline_ms,
        reservation_id=reservation.id,
        role=reservation.role,
        correction_reason=plan.correction_reason,
        max_tokens=max_tokens,
        caller=_caller(ledger, model, clock),
        listener=_listener(ledger, clock, heard := _Heard()),
        clock=clock,
        effort=None if reservation.effort is None else Effort(reservation.effort),
    )
    result: HandlerResult | None = None
    classification: Classification | None = None
    try:
        with stopper.cancellable():
            result = handler(job)
    except CallCancelled:
        late = overran(clock(), reservation)
        send = functools.partial(ledger.settle, overran=late)
        settle(attempt, cancelled(limits=heard.limits), send)
        return _Step(attempt, cancelled=True)
    except Exception as exc:  # a failing handler is an outcome to classify, by type only
        classification = classify_exception(exc)
    now = ledger.clock_fn()
    send = functools.partial(ledger.settle, overran=overran(clock(), reservation))
    if result is not None and not isinstance(result, HandlerResult):
        classification = Classification(FailureKind.UNKNOWN, "bad_handler_result")
    elif result is not None and result.ok:
        # settled without finishing: the source is done only once the commit was accepted (R-Q-1)
        answer = success(result, cost_usd=result.cost_usd, limits=heard.limits)
        settled = settle(attempt, answer, send)
        if settled.must_not_commit:
            return _Step(attempt)
        return _commit(ledger, claim, result, attempt)
    elif result is not None:
        classification = _classify(result, now)
    assert classification is not None
    usage = result if isinstance(result, HandlerResult) else None
    side_effects = usage is not None and bool(usage.side_effects)
    settle(attempt, failed(classification, usage, side_effects=side_effects,
                           limits=heard.limits), send)  # fmt: skip
    return _Step(attempt)


def _still_held(ledger: WorkerLedger, claim: store_queue.Claim) -> bool:
    """After an `unpaused` renew failed: True when the lease is still ours, so the source was
    paused meanwhile (`ledger source pause`); False when the lease was lost."""
    return ledger.renew(claim.source_id, claim.worker_id)


def _commit(
    ledger: WorkerLedger,
    claim: store_queue.Claim,
    result: HandlerResult,
    attempt: WorkerAttempt,
) -> _Step:
    """Hand an in-time success to the handler's commit, then finish the source (R-Q-1).

    Only a worker that still holds its lease commits (issue 12 item 3): one whose lease was
    lost returns LOST_LEASE and leaves the source to its new holder. A source paused during the
    call (`ledger source pause`) is not committed nor finished: it stays paused, with its reason,
    until resumed. A commit that raises is a failure of the item: nothing is finished, the source
    is claimable again after its backoff (issue 12 item 1, issue 20 item 1).
    """
    if not ledger.renew(claim.source_id, claim.worker_id, unpaused=True):
        held = _still_held(ledger, claim)
        return _Step(attempt, lost_lease=not held, paused=held)
    if result.commit is not None:
        # a commit slower than leaseMs must not let another worker claim the source meanwhile
        heartbeat = LeaseHeartbeat(
            lambda: ledger.renew(claim.source_id, claim.worker_id), ledger.policy.lease_ms
        )
        with heartbeat.running():
            try:
                result.commit()
                raised = False
            except Exception:  # the handler's own store refused: the result is not taken
                raised = True
        if raised:
            return _commit_failed(ledger, claim, attempt)
    if not ledger.finish(claim.source_id, claim.worker_id):
        return _Step(attempt, lost_lease=True)  # lost meanwhile: not ours to finish
    return _Step(attempt, accepted=True)


def _commit_failed(ledger: WorkerLedger, claim: store_queue.Claim, attempt: WorkerAttempt) -> _Step:
    """A commit that raised is one failure of the source with its backoff (issue 20 item 1):
    never a rerun at once, which would spend the source's calls in one drain."""
    failure = ledger.commit_failed(claim.source_id, claim.worker_id, attempt.route)
    if failure is None:
        return _Step(attempt, lost_lease=True)
    if failure.paused is not None:  # the failure cap (R-POL-5)
        return _Step(attempt, paused=True)
    return _Step(attempt, commit_failed=True, retry_at_ms=failure.retry_at_ms)


def run_item(
    ledger: WorkerLedger, claim: store_queue.Claim, handler: Handler, stopper: Stopper | None = None
) -> ItemReport:
    """One queue item over a claimed source (R-POL-4); the lease is always released after.

    A finished source needs no release: `finish` cleared the lease in the same transaction that
    marked it done (a release there would match nothing and only cost a write transaction). A
    source refused because it used its `sourceCalls` or `sourceTimeMs` is paused with that reason
    as it is released (`release_spent`), so a spent source stops being claimed at every pass.
    """
    report: ItemReport | None = None
    try:
        report = _run_item(ledger, claim, handler, stopper or Stopper())
    finally:
        if report is None:  # the item raised: the lease goes back all the same
            ledger.release(claim.source_id, claim.worker_id)
    if report.outcome is ItemOutcome.DONE:
        return report
    if report.outcome is ItemOutcome.REFUSED and report.refusal in SPENT_REFUSALS:
        # its counters only grow: every later claim would meet the same refusal, so the source
        # leaves the queue paused with the reason instead of being claimed at every pass
        if ledger.release_spent(claim.source_id, claim.worker_id) is not None:
            return replace(report, outcome=ItemOutcome.PAUSED)
        return report
    ledger.release(claim.source_id, claim.worker_id)
    return report


def _run_item(
    ledger: WorkerLedger, claim: store_queue.Claim, handler: Handler, stopper: Stopper
) -> ItemReport:
    source = claim.source_id
    size = input_bytes(handler, claim.payload_ref)
    plan = _first_plan(ledger, claim, size)
    if isinstance(plan, ItemReport):
        return plan
    first = _attempt(ledger, claim, handler, stopper, plan, size)
    if first.attempt is None:
        refusal = first.refused
        assert refusal is not None
        return ItemReport(
            source, ItemOutcome.REFUSED, refusal=refusal.reason, retry_at_ms=refusal.retry_at_ms,
            scope=refusal.scope,
        )  # fmt: skip
    attempts = [first.attempt.report()]
    done = _end_of(first, attempts, source)
    if done is not None:
        return done
    second = _second_attempt(ledger, claim, handler, stopper, first, size)
    if second is None:
        return _failed(first, attempts, source)
    if second.attempt is None:  # refused: the item ends after its one failed attempt
        refusal = second.refused
        if refusal is not None and refusal.reason == RefusalReason.SOURCE_PAUSED:
            return ItemReport(source, ItemOutcome.PAUSED, tuple(attempts))  # paused meanwhile
        return _failed(first, attempts, source)
    attempts.append(second.attempt.report())
    done = _end_of(second, attempts, source)
    return done if done is not None else _failed(second, attempts, source)


def _first_plan(
    ledger: WorkerLedger, claim: store_queue.Claim, size: int
) -> AttemptPlan | ItemReport:
    """The item's first attempt: the persisted corrective prompt, the owed alternate model, or
    the selection's first route; else how the item ends before any reservation."""
    source = claim.source_id
    if claim.correction is not None:  # the persisted corrective prompt comes first
        correction = claim.correction
        return AttemptPlan(
            correction.model, AttemptRole.CORRECTION, correction_reason=correction.reason
        )
    if claim.owed_fallback is not None and (owed := _owed_route(ledger, claim, size)):
        failed_model = claim.owed_fallback.failed_model
        return AttemptPlan(owed, AttemptRole.FALLBACK, fallback_from=failed_model)
    if claim.owed_fallback is not None and not claim.owed_fallback.deferred:
        retry_at = ledger.defer_owed_fallback(source, claim.worker_id)
        return ItemReport(source, ItemOutcome.FAILED, retry_at_ms=retry_at)
    selection = ledger.select(source, input_bytes=size)
    if not selection.routes:  # R-POL-6: released behind other work, retry time unchanged
        return ItemReport(source, ItemOutcome.UNROUTABLE, retry_at_ms=selection.retry_at_ms)
    return AttemptPlan.primary(selection.routes[0])


def _owed_route(ledger: WorkerLedger, claim: store_queue.Claim, size: int) -> str | None:
    """The alternate model owed after the 2nd output failure (SPEC 8), when one is eligible.

    It is a fallback like the immediate one (same selection constraints: another model, an
    allowlisted sibling included), taken as this queue item's first attempt; no `after=` is
    needed since an output failure sets no backoff.
    """
    owed = claim.owed_fallback
    assert owed is not None
    selection = ledger.select(
        claim.source_id,
        input_bytes=size,
        after_failure=FailureKind.INVALID_OUTPUT,
        failed_model=owed.failed_model,
        tried=owed.tried,
    )
    return selection.routes[0] if selection.routes else None


def _end_of(step: _Step, attempts: list[AttemptReport], source: str) -> ItemReport | None:
    """The item's outcome when this attempt ends it, else None (it failed and may continue)."""
    if step.cancelled:
        return ItemReport(source, ItemOutcome.CANCELLED, tuple(attempts))
    if step.accepted:
        return ItemReport(source, ItemOutcome.DONE, tuple(attempts))
    if step.lost_lease:
        return ItemReport(source, ItemOutcome.LOST_LEASE, tuple(attempts))
    if step.commit_failed:
        return ItemReport(
            source, ItemOutcome.COMMIT_FAILED, tuple(attempts), retry_at_ms=step.retry_at_ms
        )
    if step.paused:
        return ItemReport(source, ItemOutcome.PAUSED, tuple(attempts))
    settled = step.settled
    assert settled is not None
    if settled.kind is None:  # a success that came back late: recorded, never used
        return ItemReport(source, ItemOutcome.LATE, tuple(attempts))
    if settled.paused is not None:
        return ItemReport(source, ItemOutcome.PAUSED, tuple(attempts))
    return None


def _failed(step: _Step, attempts: list[AttemptReport], source: str) -> ItemReport:
    settled = step.settled
    paused = settled is not None and settled.paused is not None
    return ItemReport(source, ItemOutcome.PAUSED if paused else ItemOutcome.FAILED, tuple(attempts))


def _second_attempt(
    ledger: WorkerLedger,
    claim: store_queue.Claim,
    handler: Handler,
    stopper: Stopper,
    first: _Step,
    size: int,
) -> _Step | None:
    """The one permitted immediate follow-up: the corrective prompt, or a fallback route."""
    settled = first.settled
    assert settled is not None
    assert first.attempt is not None
    if stopper.requested or not (settled.use_correction or settled.fallback is not None):
        return None
    if not ledger.renew(claim.source_id, claim.worker_id):
        return None  # the lease was lost: another worker may hold the source now
    plan = plan_follow_up(
        settled,
        first.attempt.route,
        frozenset(),
        lambda kind, failed_model, tried: (
            ledger.select(
                claim.source_id,
                input_bytes=size,
                after_failure=kind,
                failed_model=failed_model,
                tried=tried,
            ).routes
        ),
    )
    if plan is None:
        return None
    return _attempt(ledger, claim, handler, stopper, plan, size, number=2)
