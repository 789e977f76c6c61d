"""The worker: one queue item (R-POL-4) and the drain loop behind `ledger worker run` (R-Q-1..4).

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

Handler contract: ``handler(job: Job) -> HandlerResult``.

- ``Job`` carries the source id, its ``payload_ref``, the ``route`` (model key) and catalog
  ``model``, the reservation's ``deadline_ms`` (ledger time, UTC ms), the attempt ``role``
  (primary / fallback / correction) and ``correction_reason`` — the broken rule to name in the
  corrective prompt (None otherwise). ``job.call(messages)`` makes the call with the built-in
  adapter of the route's provider, max tokens = the reply reservation, timeout = the deadline,
  and returns the raw ``ProviderResponse``. The deadline is kept in ledger time: the time left
  is measured from the reservation (``job.remaining_ms()``), never from the local wall clock,
  and a call that outlives it is settled ``late`` (R-HTTP-3, R-RES-11). A handler may use its
  own client instead (bounded by ``job.remaining_ms()``) and report facts.
- ``HandlerResult.success(response, commit=...)``: a usable result (usage from the response).
  ``commit`` is called only after the worker settled the attempt in time (a late result,
  R-RES-11, is never handed over) and only while the worker still holds its lease. The source is
  finished only after ``commit`` returned (R-Q-1): a commit that raises is a failure of the item
  (outcome ``commit_failed``): it counts as one failure of the source with the generic backoff
  (R-POL-3) toward the failure cap (R-POL-5), so the source is claimable again only after its
  backoff, and the worker goes on; a worker that dies before or inside the commit loses nothing
  (the source is rerun after its lease expires), so a commit should be idempotent.
- ``HandlerResult.failed_call(response)``: the worker classifies the adapter's facts.
  ``HandlerResult.failure(kind, reason)``: an explicit kind, e.g. ``invalid_output`` with
  reason ``json_contract``. ``side_effects=True`` forbids fallback and correction (R-POL-7).
- A handler that raises is classified by exception type only (its message is never read).
- Optional: ``handler.input_bytes(payload_ref) -> int`` gives the conservative request size to
  reserve; by default the payload reference's UTF-8 size plus a small margin.

Leases (R-Q-2): after each reservation the lease is extended to cover the call's deadline
(whatever ``leaseMs`` is), and it is checked again just before ``commit``; a worker that lost it
never commits (outcome ``lost_lease``). While ``commit`` runs, a heartbeat renews the lease every
leaseMs/4 (each renewal its own short write transaction; leaseMs is at least 1 s, so a renewal
may wait for the write lock well before the lease could run out); a worker whose lease was lost
during the commit does not finish the source (outcome ``lost_lease``).

Invariant: every attempt that was reserved is settled exactly once (success, failure or
`Cancelled()` on SIGINT/SIGTERM), and every claimed lease is released by its owner (R-Q-4).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any, TypeVar

from ledger.catalog import Model
from ledger.classify import Classification, classify_exception, classify_stop_reason
from ledger.clock import monotonic_s
from ledger.errors import (
    DatabaseUnreachableError,
    Refused,
    ServiceUnreachableError,
    StoreError,
    UsageError,
)
from ledger.follow_up import plan_follow_up
from ledger.kinds import AttemptRole, FailureKind, RefusalReason
from ledger.providers.base import CallRequest, Message, ProviderResponse
from ledger.providers.registry import adapter_for
from ledger.records import Cancelled, Failed, Reservation, SettleResult, Success
from ledger.store import queue as store_queue
from ledger.targets import Effort
from ledger.worker.heartbeat import LeaseHeartbeat
from ledger.worker.port import WorkerLedger
from ledger.worker.queue import (
    GLOBAL_REFUSALS,
    SPENT_REFUSALS,
    AttemptReport,
    DrainSummary,
    HandlerResult,
    ItemOutcome,
    ItemReport,
    classify_result,
)

__all__ = [
    "CallCancelled",
    "Handler",
    "HandlerResult",
    "Job",
    "Stopper",
    "drain",
    "echo_handler",
    "load_handler",
    "run_item",
]

INPUT_MARGIN_BYTES = 512
"""Added to the payload size when reserving: room for the instructions a handler adds."""
COMPACT_BATCH = 1000  # rows folded per compaction step: keeps the write lock short
MAX_SLEEP_MS = 30_000
"""The longest a `--loop` worker sleeps between passes (it re-reads the queue after)."""
MIN_SLEEP_MS = 200


@dataclass(frozen=True)
class Job:
    """One authorised call for a handler: the source, the route and the reservation's deadline."""

    source_id: str
    payload_ref: str | None
    route: str
    model: Model
    deadline_ms: int
    reservation_id: int
    role: AttemptRole
    correction_reason: str | None
    max_tokens: int
    caller: Callable[[CallRequest], ProviderResponse] = field(repr=False, compare=False)
    clock: Callable[[], int] | None = field(default=None, repr=False, compare=False)
    """Ledger time as seen during this call (reservation time + elapsed), for `remaining_ms`."""
    effort: Effort | None = None
    """This route's reasoning effort (R-RT-2), sent by `call` as R-RT-3 says."""

    def remaining_ms(self) -> int:
        """Milliseconds left before the reservation's deadline (R-HTTP-3), for a handler's own
        client: measured from the reservation in ledger time, never from the local wall clock."""
        clock = self.clock
        if clock is None:  # pragma: no cover - the worker always sets it
            raise RuntimeError("this job has no call clock")
        return max(0, self.deadline_ms - clock())

    def call(self, messages: Sequence[Message]) -> ProviderResponse:
        """Call the route with the built-in adapter, within the reservation's deadline."""
        return self.caller(
            CallRequest(
                model_id=self.model.id,
                messages=tuple(messages),
                max_tokens=self.max_tokens,
                deadline_ms=self.deadline_ms,
                reasoning=self.model.reasoning is not False,
                effort=self.effort,
            )
        )


Handler = Callable[[Job], HandlerResult]


def echo_handler(job: Job) -> HandlerResult:
    """Built-in handler: send the payload reference as a user message; the reply must be JSON."""
    messages: list[Message] = []
    if job.correction_reason is not None:
        messages.append(
            Message(
                "system",
                f"Your previous reply broke the rule `{job.correction_reason}`. "
                "Reply with one valid JSON document only.",
            )
        )
    messages.append(Message("user", job.payload_ref or job.source_id))
    response = job.call(messages)
    if not response.ok or classify_stop_reason(response.stop_reason) is not None:
        return HandlerResult.failed_call(response)
    try:
        json.loads(response.text or "")
    except ValueError:
        return HandlerResult.failure(FailureKind.INVALID_OUTPUT, "invalid_json", response=response)
    return HandlerResult.success(response)


def load_handler(spec: str) -> Handler:
    """Import `module:function` (e.g. `ledger.worker:echo_handler`)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError("--handler must be module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import error in user code is bad usage, not a crash
        raise UsageError("the handler module cannot be imported") from exc
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise UsageError("the handler is not a callable in that module")
    return handler  # type: ignore[no-any-return]


def default_worker_id() -> str:
    """host:pid:random — unique per worker process."""
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(3)}"


# --------------------------------------------------------------------------- cancellation


class CallCancelled(BaseException):
    """Raised inside a handler call when SIGINT/SIGTERM arrives (R-Q-4)."""


class Stopper:
    """Turns SIGINT/SIGTERM into a stop request; during a call it also cancels the call."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self._in_call = False

    def request(self, signum: int | None = None) -> None:
        """Ask the worker to stop after the current step."""
        self.requested = True
        self.signum = signum

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.request(signum)
        if self._in_call:
            self._in_call = False
            raise CallCancelled

    @contextmanager
    def installed(self) -> Iterator[Stopper]:
        """Handle SIGINT/SIGTERM while inside (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    @contextmanager
    def cancellable(self) -> Iterator[None]:
        """A region a signal may interrupt with CallCancelled."""
        if self.requested:
            raise CallCancelled
        self._in_call = True
        try:
            yield
        finally:
            self._in_call = False

    def sleep(self, seconds: float) -> None:
        """Sleep in short slices, waking early on a stop request."""
        end = time.monotonic() + max(0.0, seconds)
        while not self.requested:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.1, left))


# --------------------------------------------------------------------------- one queue item


@dataclass(frozen=True)
class _Step:
    """One attempt as the item sees it."""

    report: AttemptReport | None
    settled: SettleResult | None = None
    refused: Refused | None = None
    cancelled: bool = False
    accepted: bool = False
    lost_lease: bool = False
    commit_failed: bool = False
    paused: bool = False  # paused during the call or by a failed commit: the result was not taken
    retry_at_ms: int | None = None  # the backoff a failed commit set


def _input_bytes(handler: Handler, payload_ref: str | None) -> int:
    sizer = getattr(handler, "input_bytes", None)
    if callable(sizer):
        size = sizer(payload_ref)
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            return size
    return len((payload_ref or "").encode("utf-8")) + INPUT_MARGIN_BYTES


def _caller(
    ledger: WorkerLedger, model: Model, clock: Callable[[], int]
) -> Callable[[CallRequest], ProviderResponse]:
    catalog = ledger.catalog

    def call(request: CallRequest) -> ProviderResponse:
        provider = catalog.provider_for_call(model.provider)  # never a default host (issue 13)
        return adapter_for(provider, ledger.env).call(request, now_ms=clock)

    return call


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
    *,
    route: str,
    role: AttemptRole,
    size: int,
    correction_reason: str | None = None,
    fallback_from: str | None = None,
    after: int | None = None,
) -> _Step:
    started = _call_clock(ledger.clock_fn)
    try:
        reservation = ledger.reserve(
            claim.source_id, route, input_bytes=size, role=role, fallback_from=fallback_from,
            after=after,
        )
    except Refused as refusal:
        return _Step(None, refused=refusal)
    clock = started(reservation.created_ms)
    route = reservation.model  # through a pool (R-RT-4): the concrete candidate it chose
    # the lease covers the whole call, whatever leaseMs is (issue 12 item 3)
    if not ledger.renew(
        claim.source_id, claim.worker_id, cover_until_ms=reservation.deadline_ms, unpaused=True
    ):  # lost or paused before the call: nothing is sent, no failure added, the slot counts
        settled = ledger.settle(reservation.id, Cancelled())
        report = AttemptReport(reservation.id, route, reservation.role, FailureKind.CANCELLED.value)
        held = _still_held(ledger, claim)
        return _Step(report, settled, lost_lease=not held, paused=held)
    model = ledger.model(route)
    job = Job(
        source_id=claim.source_id,
        payload_ref=claim.payload_ref,
        route=route,
        model=model,
        deadline_ms=reservation.deadline_ms,
        reservation_id=reservation.id,
        role=reservation.role,
        correction_reason=correction_reason,
        max_tokens=model.reply_reservation(ledger.policy.reply_tokens),
        caller=_caller(ledger, model, clock),
        clock=clock,
        effort=None if reservation.effort is None else Effort(reservation.effort),
    )
    result: HandlerResult | None = None
    classification: Classification | None = None
    try:
        with stopper.cancellable():
            result = handler(job)
    except CallCancelled:
        settled = ledger.settle(reservation.id, Cancelled(), overran=_overran(clock, reservation))
        report = AttemptReport(reservation.id, route, reservation.role, FailureKind.CANCELLED.value)
        return _Step(report, settled, cancelled=True)
    except Exception as exc:  # a failing handler is an outcome to classify, by type only
        classification = classify_exception(exc)
    now = ledger.clock_fn()
    overran = _overran(clock, reservation)
    if result is not None and not isinstance(result, HandlerResult):
        classification = Classification(FailureKind.UNKNOWN, "bad_handler_result")
    elif result is not None and result.ok:
        # settled without finishing: the source is done only once the commit was accepted (R-Q-1)
        settled = ledger.settle(
            reservation.id,
            Success(
                result.input_tokens,
                result.output_tokens,
                result.cost_usd,
                cache_write_tokens=result.cache_write_tokens,
                cache_read_tokens=result.cache_read_tokens,
            ),
            overran=overran,
        )
        report = AttemptReport(reservation.id, route, reservation.role, None, settled.late)
        if settled.must_not_commit:
            return _Step(report, settled)
        return _commit(ledger, claim, result, report, settled)
    elif result is not None:
        classification = _classify(result, now)
    assert classification is not None
    usage = result if isinstance(result, HandlerResult) else HandlerResult(ok=False)
    settled = ledger.settle(
        reservation.id,
        Failed(
            classification,
            side_effects=bool(usage.side_effects),
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            cache_read_tokens=usage.cache_read_tokens,
        ),
        overran=overran,
    )
    report = AttemptReport(
        reservation.id, route, reservation.role, settled.kind, settled.late, settled.subkind
    )
    return _Step(report, settled)


def _still_held(ledger: WorkerLedger, claim: store_queue.Claim) -> bool:
    """After an `unpaused` renew failed: True when the lease is still ours, so the source was
    paused meanwhile (`ledger source pause`); False when the lease was lost."""
    return ledger.renew(claim.source_id, claim.worker_id)


def _overran(clock: Callable[[], int], reservation: Reservation) -> bool:
    return clock() > reservation.deadline_ms


def _commit(
    ledger: WorkerLedger,
    claim: store_queue.Claim,
    result: HandlerResult,
    report: AttemptReport,
    settled: SettleResult,
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
        return _Step(report, settled, lost_lease=not held, paused=held)
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
            return _commit_failed(ledger, claim, report, settled)
    if not ledger.finish(claim.source_id, claim.worker_id):
        return _Step(report, settled, lost_lease=True)  # lost meanwhile: not ours to finish
    return _Step(report, settled, accepted=True)


def _commit_failed(
    ledger: WorkerLedger, claim: store_queue.Claim, report: AttemptReport, settled: SettleResult
) -> _Step:
    """A commit that raised is one failure of the source with its backoff (issue 20 item 1):
    never a rerun at once, which would spend the source's calls in one drain."""
    failure = ledger.commit_failed(claim.source_id, claim.worker_id, report.model)
    if failure is None:
        return _Step(report, settled, lost_lease=True)
    if failure.paused is not None:  # the failure cap (R-POL-5)
        return _Step(report, settled, paused=True)
    return _Step(report, settled, commit_failed=True, retry_at_ms=failure.retry_at_ms)


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
    size = _input_bytes(handler, claim.payload_ref)
    if claim.correction is not None:  # the persisted corrective prompt comes first
        first = _attempt(
            ledger, claim, handler, stopper, route=claim.correction.model,
            role=AttemptRole.CORRECTION, size=size, correction_reason=claim.correction.reason,
        )
    elif claim.owed_fallback is not None and (owed := _owed_route(ledger, claim, size)):
        first = _attempt(
            ledger, claim, handler, stopper, route=owed, role=AttemptRole.FALLBACK, size=size,
            fallback_from=claim.owed_fallback.failed_model,
        )
    elif claim.owed_fallback is not None and not claim.owed_fallback.deferred:
        retry_at = ledger.defer_owed_fallback(source, claim.worker_id)
        return ItemReport(source, ItemOutcome.FAILED, retry_at_ms=retry_at)
    else:
        selection = ledger.select(source, input_bytes=size)
        if not selection.routes:  # R-POL-6: released behind other work, retry time unchanged
            return ItemReport(source, ItemOutcome.UNROUTABLE, retry_at_ms=selection.retry_at_ms)
        first = _attempt(
            ledger, claim, handler, stopper, route=selection.routes[0],
            role=AttemptRole.PRIMARY, size=size,
        )
    if first.report is None:
        refusal = first.refused
        assert refusal is not None
        return ItemReport(
            source, ItemOutcome.REFUSED, refusal=refusal.reason, retry_at_ms=refusal.retry_at_ms
        )
    attempts = [first.report]
    done = _end_of(first, attempts, source)
    if done is not None:
        return done
    second = _second_attempt(ledger, claim, handler, stopper, first, size)
    if second is None:
        return _failed(first, attempts, source)
    if second.report is None:  # refused: the item ends after its one failed attempt
        refusal = second.refused
        if refusal is not None and refusal.reason == RefusalReason.SOURCE_PAUSED:
            return ItemReport(source, ItemOutcome.PAUSED, tuple(attempts))  # paused meanwhile
        return _failed(first, attempts, source)
    attempts.append(second.report)
    done = _end_of(second, attempts, source)
    return done if done is not None else _failed(second, attempts, source)


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
    assert first.report is not None
    if stopper.requested or not (settled.use_correction or settled.fallback is not None):
        return None
    if not ledger.renew(claim.source_id, claim.worker_id):
        return None  # the lease was lost: another worker may hold the source now
    plan = plan_follow_up(
        settled,
        first.report.model,
        frozenset(),
        lambda kind, failed, tried: ledger.select(
            claim.source_id, input_bytes=size, after_failure=kind, failed_model=failed,
            tried=tried,
        ).routes,
    )
    if plan is None:
        return None
    return _attempt(
        ledger, claim, handler, stopper, route=plan.route, role=plan.role, size=size,
        correction_reason=plan.correction_reason, fallback_from=plan.fallback_from,
        after=plan.after,
    )


# --------------------------------------------------------------------------- the drain loop


@dataclass
class _Pass:
    productive: bool = False
    wake_ms: int | None = None
    stop: bool = False

    def hint(self, at_ms: int | None) -> None:
        if at_ms is not None:
            self.wake_ms = at_ms if self.wake_ms is None else min(self.wake_ms, at_ms)


def drain(
    ledger: WorkerLedger,
    handler: Handler,
    *,
    worker_id: str | None = None,
    loop: bool = False,
    max_items: int | None = None,
    stopper: Stopper | None = None,
    on_item: Callable[[ItemReport, DrainSummary], Any] | None = None,
    max_sleep_ms: int = MAX_SLEEP_MS,
    on_unreachable: Callable[[StoreError], Any] | None = None,
) -> DrainSummary:
    """Drain due sources (R-Q-3): pass after pass, each visiting a due source at most once.

    Without `loop` it returns when a pass granted no reservation (nothing workable is due) or
    after `max_items`; with `loop` it then sleeps until the soonest retry time, cooldown end or
    budget slot (at most `max_sleep_ms`) and polls again, until stopped. With `loop`, a database
    server or `ledger serve` out of reach (past the store's or the client's own reconnect wait)
    is reported once to `on_unreachable` and waited out with backoff.
    """
    worker = worker_id or default_worker_id()
    stopper = stopper or Stopper()
    summary = DrainSummary()
    reach = _Reach(loop, on_unreachable)
    reach.poll(lambda: _compact_step(ledger), 0)
    while not stopper.requested and not _limit_reached(summary, max_items):
        state = _drain_pass(ledger, handler, worker, stopper, summary, max_items, on_item, reach)
        if state.stop or stopper.requested or _limit_reached(summary, max_items):
            break
        if state.productive:
            continue
        if not loop:
            break
        reach.poll(lambda: _compact_step(ledger), 0)
        wake = functools.partial(_sleep_ms, ledger, state.wake_ms, max_sleep_ms)
        stopper.sleep(reach.sleep_ms(wake, max_sleep_ms) / 1000)
    summary.stopped_by_signal = stopper.requested
    return summary


_T = TypeVar("_T")
UNREACHABLE = (DatabaseUnreachableError, ServiceUnreachableError)
"""A database server or a `ledger serve` out of reach: what a `--loop` worker waits out."""


@dataclass
class _Reach:
    """Whether the ledger answers. With `loop`, a database server or service that stayed out of
    reach past the store's or client's own reconnect wait (a restart, a failover, `systemctl
    restart`) makes an empty poll: the loop says so once, waits with backoff and polls again
    rather than exit while work may still be queued (issue 20 item 8, issue 29 item 9)."""

    loop: bool
    on_unreachable: Callable[[StoreError], Any] | None = None
    down: bool = False
    backoff_ms: int = MIN_SLEEP_MS
    orphans: list[store_queue.Claim] = field(default_factory=list)  # leases left mid-item

    def release_orphans(self, ledger: WorkerLedger) -> None:
        """Give back the leases of items the outage cut short, once the ledger answers again:
        their sources are claimable at once rather than when the lease runs out (their open
        reservations still count until they expire, as after a crash)."""
        while self.orphans:
            lease = self.orphans[0]
            give_back = functools.partial(ledger.release, lease.source_id, lease.worker_id)
            if self.poll(give_back, None) is None:
                return  # out of reach again: tried at the next pass
            self.orphans.pop(0)

    def poll(self, step: Callable[[], _T], otherwise: _T) -> _T:
        """`step()`; with `loop`, `otherwise` while out of reach."""
        try:
            value = step()
        except UNREACHABLE as error:
            self.lost(error)
            return otherwise
        self.down, self.backoff_ms = False, MIN_SLEEP_MS
        return value

    def sleep_ms(self, step: Callable[[], int], cap_ms: int) -> int:
        """How long to sleep: `step()`, or while out of reach the next backoff (doubling from
        MIN_SLEEP_MS up to `cap_ms`)."""
        found = self.poll(step, None)
        if found is not None:
            return found
        pause = min(self.backoff_ms, cap_ms)
        self.backoff_ms = min(self.backoff_ms * 2, cap_ms)
        return pause

    def lost(self, error: StoreError) -> None:
        """Out of reach: raised on without `loop`, else reported once per outage."""
        if not self.loop:
            raise error
        if not self.down and self.on_unreachable is not None:
            self.on_unreachable(error)
        self.down = True


def _compact_step(ledger: WorkerLedger) -> int:
    """One bounded compaction batch (R-DB-6) per drain start and idle poll; busy is no failure."""
    return ledger.compact(COMPACT_BATCH)


def _limit_reached(summary: DrainSummary, max_items: int | None) -> bool:
    return max_items is not None and summary.items >= max_items


def _drain_pass(
    ledger: WorkerLedger,
    handler: Handler,
    worker: str,
    stopper: Stopper,
    summary: DrainSummary,
    max_items: int | None,
    on_item: Callable[[ItemReport, DrainSummary], Any] | None,
    reach: _Reach,
) -> _Pass:
    state = _Pass()
    started = reach.poll(ledger.ledger_now, None)
    if started is not None:
        reach.release_orphans(ledger)
    seen: set[str] = set()
    while started is not None and not stopper.requested and not _limit_reached(summary, max_items):
        claim = reach.poll(lambda: ledger.claim(worker, checked_before=started), None)
        if claim is None:
            break
        if claim.source_id in seen:  # same-millisecond edge: never twice in one pass
            ledger.release(claim.source_id, worker)
            break
        seen.add(claim.source_id)
        try:
            item = run_item(ledger, claim, handler, stopper)
        except UNREACHABLE as error:
            # out of reach mid-item: the lease is given back once the ledger answers again
            reach.lost(error)
            reach.orphans.append(claim)
            break
        summary.add(item)
        if on_item is not None:
            on_item(item, summary)
        state.productive |= item.reserved and item.outcome is not ItemOutcome.CANCELLED
        state.hint(item.retry_at_ms)
        if item.refusal in GLOBAL_REFUSALS:  # every other source would be refused alike
            break
        if item.outcome is ItemOutcome.CANCELLED:
            state.stop = True
            break
    return state


def _sleep_ms(ledger: WorkerLedger, wake_ms: int | None, cap_ms: int) -> int:
    times = ledger.queue_times()
    candidates = [t for t in (wake_ms, times.next_retry_ms, times.next_lease_expiry_ms) if t]
    wait = min(candidates) - times.now_ms if candidates else cap_ms
    return max(MIN_SLEEP_MS, min(cap_ms, wait))

