"""What a simulation replays: source arrivals and provider behaviour (from a trace or a scenario).

`Workload` is the common shape; `Behaviour` answers "how does a call to this model go at this
moment" with a `Reply`. A recorded trace answers from its observations:

- `time` replay (the default): a call gets the outcome recorded on the same model nearest in time
  (an outage recorded from 02:00 to 02:40 fails calls made then, whatever policy makes them);
  after the recording's last event nothing is known, and every target answers as healthy;
- `sequence` replay: the n-th call on a model gets the n-th outcome recorded on it (how the
  demo's own stand-in is scripted; replaying the same policy then repeats the recording exactly).

A model the trace never observed answers as healthy (`observed` False; the report counts these
calls) with the trace's typical latency and tokens. Cancelled, expired and open attempts are no
observation of the provider and are skipped.

Invariant: pure and deterministic — no clock, no I/O; randomness only from the `random.Random`
handed in.
"""

from __future__ import annotations

import bisect
import random
import statistics
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ledger.kinds import FailureKind
from ledger.simulate.provider import Reply
from ledger.simulate.trace import Trace, TraceAttempt

ReplayMode = Literal["time", "sequence"]
DEFAULT_LATENCY_MS = 1000
DEFAULT_INPUT_BYTES = 4000


@dataclass(frozen=True)
class Arrival:
    """One source entering the queue at `at_ms` (UTC ms) with its request size."""

    at_ms: int
    source: str
    input_bytes: int
    scopes: tuple[str, ...] = ()  # the scopes its source is added under (R-SC-1)


class Behaviour(Protocol):
    """How the provider stand-in answers."""

    def reply(self, model: str, provider: str, at_ms: int) -> tuple[Reply, bool]:
        """The call's outcome and whether the input observed (or described) this target."""
        ...


@dataclass(frozen=True)
class Workload:
    """Arrivals, a behaviour factory (fresh per run, from the seed) and the time span."""

    kind: Literal["trace", "scenario"]
    start_ms: int
    end_ms: int
    arrivals: tuple[Arrival, ...]
    behaviour: Callable[[random.Random], Behaviour] = field(repr=False, compare=False)
    worker_start_ms: int | None = None
    """When the worker's first poll happens (None: at `start_ms`). A trace's worker starts at
    its first recorded call: the sources that arrived before it were all waiting for it."""


def _observation(attempt: TraceAttempt, typical: Reply) -> Reply:
    return Reply(
        kind=None if attempt.kind is None else FailureKind(attempt.kind),
        subkind=attempt.subkind,
        reason=attempt.reason,
        latency_ms=attempt.duration_ms if attempt.duration_ms is not None else typical.latency_ms,
        input_tokens=attempt.input_tokens,
        output_tokens=attempt.output_tokens,
        retry_after_ms=attempt.retry_after_ms,
    )


_OBSERVED = frozenset({"succeeded", "failed"})


class TraceBehaviour:
    """Answers from a trace's observations, per model, by time or by sequence."""

    def __init__(self, trace: Trace, mode: ReplayMode) -> None:
        self._mode = mode
        self._end_ms = trace.start_ms + recording_end(trace)
        observed = [a for a in trace.attempts if a.status in _OBSERVED]
        self._typical = _typical(observed)
        by_model: dict[str, list[tuple[int, Reply]]] = defaultdict(list)
        for attempt in observed:
            by_model[attempt.model].append(
                (trace.start_ms + attempt.at_ms, _observation(attempt, self._typical))
            )
        self._times = {m: [t for t, _ in rows] for m, rows in by_model.items()}
        self._replies = {m: [r for _, r in rows] for m, rows in by_model.items()}
        self._queues = {m: deque(r for _, r in rows) for m, rows in by_model.items()}

    def reply(self, model: str, provider: str, at_ms: int) -> tuple[Reply, bool]:
        """The recorded outcome for this call (see the module docstring)."""
        if model not in self._replies or (self._mode == "time" and at_ms > self._end_ms):
            return self._typical, False
        if self._mode == "sequence":
            queue = self._queues[model]
            return (queue.popleft(), True) if queue else (self._typical, False)
        times = self._times[model]
        i = bisect.bisect_left(times, at_ms)
        if i == len(times) or (i > 0 and at_ms - times[i - 1] <= times[i] - at_ms):
            i -= 1
        return self._replies[model][i], True


def _typical(attempts: Sequence[TraceAttempt]) -> Reply:
    """A healthy reply with the trace's median success latency and tokens."""
    ok = [a for a in attempts if a.kind is None]

    def median(values: list[int], default: int | None) -> int | None:
        return int(statistics.median_low(values)) if values else default

    return Reply(
        latency_ms=median([a.duration_ms for a in ok if a.duration_ms is not None],
                          DEFAULT_LATENCY_MS) or DEFAULT_LATENCY_MS,
        input_tokens=median([a.input_tokens for a in ok if a.input_tokens is not None], None),
        output_tokens=median([a.output_tokens for a in ok if a.output_tokens is not None], None),
    )


def recording_end(trace: Trace) -> int:
    """Milliseconds after the start of the recording's last event (the end of its last attempt,
    or its last arrival); the export time (`endMs`) only for a trace without events. A worker
    that stopped after its last call (`ledger demo`, a cron `--once` run) left no events after
    it, and the idle time until the export must not become simulated work."""
    events = [a.at_ms + (a.duration_ms or 0) for a in trace.attempts]
    events.extend(a.at_ms for a in trace.arrivals)
    return max(events) if events else trace.end_ms


def trace_workload(trace: Trace, mode: ReplayMode = "time") -> Workload:
    """A trace as a workload: its arrivals (sizes from each source's first attempt)."""
    sizes: dict[int, int] = {}
    for attempt in trace.attempts:
        if attempt.input_bytes is not None:
            sizes.setdefault(attempt.source, attempt.input_bytes)
    arrivals = tuple(
        Arrival(
            trace.start_ms + a.at_ms,
            f"s{a.source:06d}",
            sizes.get(a.source, DEFAULT_INPUT_BYTES),
        )
        for a in sorted(trace.arrivals, key=lambda a: (a.at_ms, a.source))
    )
    first_call = min((a.at_ms for a in trace.attempts), default=0)
    return Workload(
        "trace", trace.start_ms, trace.start_ms + recording_end(trace), arrivals,
        lambda _rng: TraceBehaviour(trace, mode), trace.start_ms + first_call,
    )
