"""Run one policy over a workload: the REAL ledger code in virtual time (R-SIM-1, R-SIM-3).

A fresh SQLite ledger built by the migrations in a temporary directory, opened with the virtual
clock as its clock and a seeded jitter, on a throw-away database (no fsync, journal in memory, no
write-lock file: only this process uses it, and it is deleted after the run); the real worker
drain loop (`ledger.worker.drain.drain` in `--loop` form) with the real selection, reservations,
budgets, policy table and queue; a handler that answers through the in-process provider
stand-in. Where the worker would sleep, `VirtualStopper.sleep` moves the virtual clock by the
same amount instead (the worker's own wake time: the soonest retry, cooldown end or budget slot,
at most 30 s); sources arriving meanwhile are enqueued when virtual time reaches them and seen at
the worker's next poll, as a real `--loop` worker would. `clock.virtual_time` makes the worker's
elapsed-time reading follow the same clock. The lease heartbeat thread runs only while a
handler's `commit` runs; the simulated handler has none, so no thread and no real wait is ever
started.

Invariant: nothing here reads the wall clock or sleeps; the same workload, policy, catalog and
seed give the same result.
"""

from __future__ import annotations

import os
import random
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.clock import virtual_time
from ledger.config import Policy
from ledger.home import state_dir
from ledger.providers.openai_chat import OpenAIChatAdapter
from ledger.providers.registry import ADAPTERS
from ledger.simulate.idle import busy_poll, last_poll_until
from ledger.simulate.provider import call_result
from ledger.simulate.vclock import VirtualClock
from ledger.simulate.workload import Arrival, Behaviour, Workload
from ledger.store import Store
from ledger.store.history import CooldownBand, History, active_cooldown_bands, read_history
from ledger.store.pending import open_database
from ledger.store.queue import QueueTotals, any_due, has_work, queue_times, totals
from ledger.worker.drain import MAX_SLEEP_MS, MIN_SLEEP_MS, drain
from ledger.worker.handler import Job
from ledger.worker.queue import DrainSummary, HandlerResult, ItemReport
from ledger.worker.stop import Stopper

WORKER_ID = "sim-worker"
MEMORY_DIR = Path("/dev/shm")  # noqa: S108 - only the parent of a mkdtemp (0700, random name)
"""Where the throw-away ledger goes when this host has a memory filesystem: a simulated run
commits thousands of transactions, and their fsyncs would only measure the disk."""
SIMULATED_CREDENTIAL = "simulated"
"""Not a secret: every catalog credential variable is set to this inside a simulation, so every
catalog provider counts as available (no call ever leaves the process)."""


@dataclass
class RunRecord:
    """What one simulated run produced (read back from its ledger, plus what the loop saw)."""

    history: History
    totals: QueueTotals
    summary: DrainSummary
    refusals: Counter[str]
    outcomes: Counter[str]
    bands: dict[tuple[str, str, str, int], CooldownBand]
    unobserved_calls: int
    drained_at_ms: int | None
    end_ms: int


class _Feeder:
    """Adds arrivals to the queue once virtual time reaches them."""

    def __init__(self, arrivals: tuple[Arrival, ...]) -> None:
        self._arrivals = arrivals
        self._next = 0

    def pending(self) -> bool:
        return self._next < len(self._arrivals)

    def next_at(self) -> int | None:
        """When the next arrival comes (None: all have)."""
        return self._arrivals[self._next].at_ms if self.pending() else None

    def add_due(self, ledger: Ledger, now: int) -> None:
        arrivals = self._arrivals
        while self._next < len(arrivals) and arrivals[self._next].at_ms <= now:
            arrival = arrivals[self._next]
            # a scope this run's policy does not define does not limit it (R-SC-1)
            scopes = [s for s in arrival.scopes if s in ledger.policy.scopes]
            ledger.add_source(arrival.source, arrival.source, scopes=scopes)
            self._next += 1

    def add_until(self, ledger: Ledger, clock: VirtualClock, until_ms: int) -> None:
        """Before the worker starts: each arrival at its own time, then the clock at `until_ms`."""
        arrivals = self._arrivals
        while self._next < len(arrivals) and arrivals[self._next].at_ms <= until_ms:
            clock.advance_to(arrivals[self._next].at_ms)
            self.add_due(ledger, clock.now())
        clock.advance_to(until_ms)


@dataclass
class _Handler:
    """The worker's handler: one call through the provider stand-in."""

    behaviour: Behaviour
    clock: VirtualClock
    sizes: dict[str, int]
    anthropic: frozenset[str] = frozenset()
    """The providers speaking Anthropic's format (their answers' rate-limit headers are its)."""
    unobserved: int = 0

    def __call__(self, job: Job) -> HandlerResult:
        provider = job.model.provider
        reply, observed = self.behaviour.reply(job.route, provider, self.clock.now())
        self.unobserved += not observed
        return call_result(job, reply, self.clock, anthropic=provider in self.anthropic)

    def input_bytes(self, payload_ref: str | None) -> int:
        """The recorded (or described) request size of the source."""
        return self.sizes.get(payload_ref or "", 0)


class VirtualStopper(Stopper):
    """The worker's stopper whose `sleep` moves virtual time and feeds arrivals."""

    def __init__(
        self, clock: VirtualClock, feeder: _Feeder, ledger: Ledger, end_ms: int,
        skip_idle: bool = True,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._feeder = feeder
        self._ledger = ledger
        self._end_ms = end_ms
        self._skip_idle = skip_idle
        self.drained_at_ms: int | None = None

    def sleep(self, seconds: float) -> None:
        """Advance by the worker's own sleep (as a `--loop` worker, it sees arrivals at its next
        poll, not before); stop once nothing is queued or due to arrive, or at the end. Polls
        that would find nothing are jumped over (`ledger.simulate.idle`; `skip_idle=False`
        steps through them, the reference the jump is tested against)."""
        now = self._clock.now()
        if not self._feeder.pending() and _queue_empty(self._ledger):
            self.drained_at_ms = now
            self.request()
            return
        target = now + max(1, round(seconds * 1000))
        if self._skip_idle:
            target = self._first_busy_poll(target)
        if target > self._end_ms:
            last = last_poll_until(now + max(1, round(seconds * 1000)), self._end_ms,
                                   MAX_SLEEP_MS) if self._skip_idle else None
            if last is not None:
                self._clock.advance_to(last)  # where stepping would have stopped
            self.request()
            return
        self._clock.advance_to(target)
        self._feeder.add_due(self._ledger, self._clock.now())

    def _first_busy_poll(self, first_ms: int) -> int:
        """The first of the worker's coming polls that finds a due source or an arrival."""
        arrival = self._feeder.next_at()
        if (arrival is not None and arrival <= first_ms) or any_due(self._ledger.db, first_ms):
            return first_ms
        times = queue_times(self._ledger.db)
        due = min((t for t in (times.next_retry_ms, times.next_lease_expiry_ms) if t),
                  default=None)
        busy = busy_poll(first_ms, due, arrival, MAX_SLEEP_MS, MIN_SLEEP_MS)
        return first_ms if busy is None else busy


def _queue_empty(ledger: Ledger) -> bool:
    """Nothing queued or leased is left (an index lookup: the day's finished sources are not
    counted, as a full `totals` would on every idle wake)."""
    return not has_work(ledger.db)


def _throwaway_ledger(
    tmp: Path, policy: Policy, catalog: Catalog, clock: VirtualClock, jitter: random.Random
) -> Ledger:
    """A fresh ledger built by the migrations in `tmp`, as `Ledger.open` makes one, on a
    throw-away database: this process alone uses it and it is deleted after the run, so its
    durability is irrelevant (no fsync, journal in memory, no write-lock file)."""
    state = state_dir(str(tmp), str(tmp / "ledger.db"))
    database = open_database(
        state.db_url, create=True, busy_timeout_ms=policy.busy_timeout_ms, clock_fn=clock.now,
        throwaway=True,
    )
    return Ledger(state, policy, catalog, Store(database, jitter.random), simulated_env(catalog))


def simulated_env(catalog: Catalog) -> dict[str, str]:
    """Every credential variable the catalog names, set to a fixed non-secret placeholder."""
    return {
        p.credential_env: SIMULATED_CREDENTIAL
        for p in catalog.providers.values()
        if p.credential_env
    }


def anthropic_providers(catalog: Catalog) -> frozenset[str]:
    """The catalog's providers whose answers report token limits Anthropic's way."""
    return frozenset(
        name
        for name, p in catalog.providers.items()
        if ADAPTERS.get(p.api, OpenAIChatAdapter).anthropic_limits
    )


def run_policy(
    workload: Workload,
    policy: Policy,
    catalog: Catalog,
    seed: int,
    end_ms: int,
    on_progress: Callable[[int, int], object] | None = None,
    *,
    skip_idle: bool = True,
) -> RunRecord:
    """Run `policy` over `workload` until the queue drains or virtual time reaches `end_ms`.

    `on_progress(virtual_now_ms, items)` is called after every queue item (benchmarks sample
    memory with it); it must not touch the ledger.
    """
    clock = VirtualClock(workload.start_ms)
    behaviour = workload.behaviour(random.Random(seed))
    jitter = random.Random(seed + 1)
    sizes = {a.source: a.input_bytes for a in workload.arrivals}
    refusals: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    bands: dict[tuple[str, str, str, int], CooldownBand] = {}
    scratch = MEMORY_DIR if MEMORY_DIR.is_dir() and os.access(MEMORY_DIR, os.W_OK) else None
    with (
        tempfile.TemporaryDirectory(prefix="ledger-sim-", dir=scratch) as tmp,
        virtual_time(clock.now),
    ):
        ledger = _throwaway_ledger(Path(tmp), policy, catalog, clock, jitter)
        try:
            feeder = _Feeder(workload.arrivals)
            handler = _Handler(behaviour, clock, sizes, anthropic_providers(catalog))
            stopper = VirtualStopper(clock, feeder, ledger, end_ms, skip_idle)

            def on_item(item: ItemReport, _summary: DrainSummary) -> None:
                outcomes[item.outcome.value] += 1
                if item.refusal is not None:
                    refusals[str(item.refusal)] += 1
                if any(a.kind is not None for a in item.attempts):
                    _, active = active_cooldown_bands(ledger.db)
                    for band in active:
                        key = (band.scope, band.target, band.origin, band.created_ms)
                        old = bands.get(key)
                        if old is None or band.until_ms > old.until_ms:
                            bands[key] = band
                feeder.add_due(ledger, clock.now())
                if on_progress is not None:
                    on_progress(clock.now(), sum(outcomes.values()))

            feeder.add_until(ledger, clock, workload.worker_start_ms or workload.start_ms)
            summary = drain(
                ledger, handler, worker_id=WORKER_ID, loop=True, stopper=stopper,
                on_item=on_item, max_sleep_ms=MAX_SLEEP_MS,  # the cap `idle` reckons with
            )
            history = read_history(ledger.db)
            facts = totals(ledger.db, policy.calls_per_hour)
        finally:
            ledger.close()
    return RunRecord(
        history=history,
        totals=facts,
        summary=summary,
        refusals=refusals,
        outcomes=outcomes,
        bands=bands,
        unobserved_calls=handler.unobserved,
        drained_at_ms=stopper.drained_at_ms,
        end_ms=clock.now(),
    )


@dataclass(frozen=True)
class Comparison:
    """The current policy's run and, when given, the candidate's."""

    workload: Workload
    seed: int
    end_ms: int
    current: RunRecord
    candidate: RunRecord | None = field(default=None)


def compare(
    workload: Workload,
    current: Policy,
    catalog: Catalog,
    seed: int,
    *,
    candidate: Policy | None = None,
    drain_for_ms: int = 0,
) -> Comparison:
    """Run the current policy (and the candidate) over the same workload and seed."""
    end_ms = workload.end_ms + drain_for_ms
    first = run_policy(workload, current, catalog, seed, end_ms)
    second = None if candidate is None else run_policy(workload, candidate, catalog, seed, end_ms)
    return Comparison(workload, seed, end_ms, first, second)
