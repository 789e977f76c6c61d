"""The drain loop behind `ledger worker run` (R-Q-1..4): pass after pass over the due sources,
one queue item each (item.py); waiting happens only between passes, bounded by the soonest retry
time (capped at MAX_SLEEP_MS), and a ledger out of reach is waited out with `--loop`.

Invariant: a pass visits a due source at most once, and every claimed lease is given back by its
owner: by the item, or after an outage cut the item short, once the ledger answers again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ledger.errors import DatabaseUnreachableError, ServiceUnreachableError, StoreError
from ledger.kinds import ExclusionReason, RefusalReason
from ledger.store import queue as store_queue
from ledger.telemetry import queue_item
from ledger.worker.handler import Handler, default_worker_id
from ledger.worker.item import run_item
from ledger.worker.port import WorkerLedger
from ledger.worker.queue import GLOBAL_REFUSALS, DrainSummary, ItemOutcome, ItemReport
from ledger.worker.stop import Stopper

__all__ = ["MAX_SLEEP_MS", "MIN_SLEEP_MS", "drain"]

COMPACT_BATCH = 1000  # rows folded per compaction step: keeps the write lock short
MAX_SLEEP_MS = 30_000
"""The longest a `--loop` worker sleeps between passes (it re-reads the queue after)."""
MIN_SLEEP_MS = 200


@dataclass
class _Pass:
    productive: bool = False
    wake_ms: int | None = None
    stop: bool = False
    full_scopes: set[str] = field(default_factory=set)
    """Scopes whose token window has no room for even the smallest request: the rest of the
    pass claims none of their sources."""

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


TOKEN_REFUSALS = frozenset(
    {RefusalReason.TOKEN_BUDGET.value, RefusalReason.PROVIDER_TOKENS_EXHAUSTED.value}
)
_TOKEN_EXCLUSIONS = frozenset(
    {ExclusionReason.TOKEN_BUDGET.value, ExclusionReason.PROVIDER_TOKENS_EXHAUSTED.value}
)


def _tokens_full(ledger: WorkerLedger, item: ItemReport) -> tuple[bool, int | None]:
    """After an item that found no token room (refused `token_budget` or
    `provider_tokens_exhausted`, or left without a route): whether the smallest request (no
    input, no source) has no route either with a token window or learned limit among what leaves
    its models out, and when one frees. Then every other due source of the pass would be left out
    alike (they route over the same models, and a larger request needs more room): the pass
    ends, as on the hourly budget, instead of claiming and releasing each of them."""
    if item.refusal not in TOKEN_REFUSALS and item.outcome is not ItemOutcome.UNROUTABLE:
        return False, None
    smallest = ledger.select(None, input_bytes=0)
    if smallest.routes:
        return False, None
    return any(e.reason in _TOKEN_EXCLUSIONS for e in smallest.excluded), smallest.retry_at_ms


_SMALLEST_AMOUNT = {
    "tokensPerMinute": True,  # input (none) and reply allowance
    "tokensPerDay": True,
    "outputTokensPerMinute": True,
    "inputTokensPerMinute": False,  # no input: only a window already over its limit is full
}


def _scope_tokens_full(ledger: WorkerLedger, item: ItemReport) -> tuple[bool, int | None]:
    """After an item refused `token_budget` by a scope's token window (R-TOK-1, R-SC-1):
    whether that window has no room for even the smallest request (no input, the smallest reply
    allowance of the models offered for it), and when its first part leaves. Then every other
    source added under the scope would be refused alike: the rest of the pass claims none of
    them, and the sources of other scopes still go."""
    if item.refusal != RefusalReason.TOKEN_BUDGET.value or item.scope is None:
        return False, None
    models = [r for r in ledger.select(None, input_bytes=0).routes if "/" in r
              and not r.startswith("pool/")]  # fmt: skip
    allowance = min(
        (ledger.model(r).reply_reservation(ledger.policy.reply_tokens) for r in models),
        default=0,
    )
    full = [
        w for w in ledger.token_windows()
        if w.kind == "scope" and w.name == item.scope
        and w.used + (allowance if _SMALLEST_AMOUNT.get(w.window, False) else 0) > w.limit
    ]  # fmt: skip
    if not full:
        return False, None
    return True, max((w.frees_at_ms for w in full if w.frees_at_ms is not None), default=None)


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
        next_claim = functools.partial(
            ledger.claim, worker, checked_before=started, skip_scopes=frozenset(state.full_scopes)
        )
        claim = reach.poll(next_claim, None)
        if claim is None:
            break
        if claim.source_id in seen:  # same-millisecond edge: never twice in one pass
            ledger.release(claim.source_id, worker)
            break
        seen.add(claim.source_id)
        try:
            with queue_item(claim.source_id) as traced:  # R-OTEL-1: one span per item
                item = run_item(ledger, claim, handler, stopper)
                traced.item_done(item.outcome.value, item.refusal, len(item.attempts))
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
        try:
            tokens_full, frees_at = _tokens_full(ledger, item)
        except UNREACHABLE as error:  # the item is done; the next pass asks again
            reach.lost(error)
            break
        if tokens_full:  # every other source would find no token room alike
            state.hint(frees_at)
            break
        try:
            scope_full, frees_at = _scope_tokens_full(ledger, item)
        except UNREACHABLE as error:
            reach.lost(error)
            break
        if scope_full:  # every other source of the scope would find no token room alike
            assert item.scope is not None
            state.full_scopes.add(item.scope)
            state.hint(frees_at)
        if item.outcome is ItemOutcome.CANCELLED:
            state.stop = True
            break
    return state


def _sleep_ms(ledger: WorkerLedger, wake_ms: int | None, cap_ms: int) -> int:
    times = ledger.queue_times()
    candidates = [t for t in (wake_ms, times.next_retry_ms, times.next_lease_expiry_ms) if t]
    wait = min(candidates) - times.now_ms if candidates else cap_ms
    return max(MIN_SLEEP_MS, min(cap_ms, wait))
