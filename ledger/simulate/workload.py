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
import copy
import random
import statistics
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ledger.kinds import FailureKind
from ledger.simulate.provider import Reply
from ledger.simulate.trace import Trace, TraceArrival, TraceAttempt

ReplayMode = Literal["time", "sequence"]
DEFAULT_LATENCY_MS = 1000
DEFAULT_INPUT_BYTES = 4000


@dataclass(frozen=True, slots=True)
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


_OBSERVED = frozenset({"succeeded", "failed"})
_NONE = -1  # an absent count in the columns below (every stored value is >= 0)


def _int(value: int) -> int | None:
    return None if value == _NONE else value


class _Observations:
    """One model's recorded outcomes as columns: a few machine words per attempt, not an object
    (a five-million-attempt trace must fit in bounded memory, R-SIM-4)."""

    def __init__(self) -> None:
        self.times = array("q")
        self.outcomes = array("l")  # index into the recorder's table of (kind, subkind, reason)
        self.latency = array("q")
        self.input_tokens = array("q")
        self.output_tokens = array("q")
        self.retry_after = array("q")


class TraceRecorder:
    """Takes a trace's attempts and arrivals one at a time (as a streamed file yields them) and
    keeps only what the replay needs: per model the observations, per source its first request
    size, and the arrivals. Times are kept relative: `startMs` may come after the lists."""

    def __init__(self) -> None:
        self._models: dict[str, _Observations] = {}
        self._outcomes: dict[tuple[str | None, str | None, str | None], int] = {}
        self._ok_latency = array("q")
        self._ok_input = array("q")
        self._ok_output = array("q")
        self._sizes: dict[int, int] = {}
        self._arrival_at = array("q")
        self._arrival_source = array("q")
        self._first_call: int | None = None
        self._last_event: int | None = None

    def _event(self, at_ms: int) -> None:
        self._last_event = at_ms if self._last_event is None else max(self._last_event, at_ms)

    def add_attempt(self, attempt: TraceAttempt) -> None:
        """One recorded attempt."""
        a = attempt
        self._first_call = a.at_ms if self._first_call is None else min(self._first_call, a.at_ms)
        self._event(a.at_ms + (a.duration_ms or 0))
        if a.input_bytes is not None:
            self._sizes.setdefault(a.source, a.input_bytes)
        if a.status not in _OBSERVED:
            return
        if a.kind is None:
            if a.duration_ms is not None:
                self._ok_latency.append(a.duration_ms)
            if a.input_tokens is not None:
                self._ok_input.append(a.input_tokens)
            if a.output_tokens is not None:
                self._ok_output.append(a.output_tokens)
        column = self._models.get(a.model)
        if column is None:
            column = self._models[a.model] = _Observations()
        outcome = (a.kind, a.subkind, a.reason)
        column.times.append(a.at_ms)
        column.outcomes.append(self._outcomes.setdefault(outcome, len(self._outcomes)))
        column.latency.append(_NONE if a.duration_ms is None else a.duration_ms)
        column.input_tokens.append(_NONE if a.input_tokens is None else a.input_tokens)
        column.output_tokens.append(_NONE if a.output_tokens is None else a.output_tokens)
        column.retry_after.append(_NONE if a.retry_after_ms is None else a.retry_after_ms)

    def add_arrival(self, arrival: TraceArrival) -> None:
        """One source's arrival."""
        self._event(arrival.at_ms)
        self._arrival_at.append(arrival.at_ms)
        self._arrival_source.append(arrival.source)

    def recording_end(self, end_ms: int) -> int:
        """See `recording_end`; `end_ms` is the trace's `endMs`."""
        return end_ms if self._last_event is None else self._last_event

    def typical(self) -> Reply:
        """A healthy reply with the trace's median success latency and tokens."""

        def median(values: array[int]) -> int | None:
            return int(statistics.median_low(values)) if values else None

        return Reply(
            latency_ms=median(self._ok_latency) or DEFAULT_LATENCY_MS,
            input_tokens=median(self._ok_input),
            output_tokens=median(self._ok_output),
        )

    def workload(self, start_ms: int, end_ms: int, mode: ReplayMode = "time") -> Workload:
        """The workload: arrivals sorted by time (sizes from each source's first attempt)."""
        order = sorted(range(len(self._arrival_at)),
                       key=lambda i: (self._arrival_at[i], self._arrival_source[i]))
        arrivals = tuple(
            Arrival(
                start_ms + self._arrival_at[i],
                f"s{self._arrival_source[i]:06d}",
                self._sizes.get(self._arrival_source[i], DEFAULT_INPUT_BYTES),
            )
            for i in order
        )
        behaviour = TraceBehaviour(self, mode, start_ms, end_ms)
        return Workload(
            "trace", start_ms, start_ms + self.recording_end(end_ms), arrivals,
            lambda _rng: behaviour.fresh(), start_ms + (self._first_call or 0),
        )


class TraceBehaviour:
    """Answers from a trace's observations, per model, by time or by sequence."""

    def __init__(
        self, source: Trace | TraceRecorder, mode: ReplayMode = "time", start_ms: int = 0,
        end_ms: int = 0,
    ) -> None:
        """`start_ms`, `end_ms`: the trace's `startMs` and `endMs` (read from a `Trace`)."""
        if isinstance(source, Trace):  # a trace in memory (tests, small inputs)
            recorder = record_trace(source)
            start_ms, end_ms = source.start_ms, source.end_ms
        else:
            recorder = source
        self._recorder = recorder
        self._start_ms = start_ms
        self._mode = mode
        self._end_ms = start_ms + recorder.recording_end(end_ms)
        self._typical = recorder.typical()
        self._outcomes = [
            (None if kind is None else FailureKind(kind), subkind, reason)
            for (kind, subkind, reason) in recorder._outcomes
        ]
        self._next: dict[str, int] = {}

    def fresh(self) -> TraceBehaviour:
        """The same observations, with the sequence replay at its start (one per run)."""
        twin = copy.copy(self)
        twin._next = {}
        return twin

    def _reply(self, column: _Observations, i: int) -> Reply:
        kind, subkind, reason = self._outcomes[column.outcomes[i]]
        latency = _int(column.latency[i])
        return Reply(
            kind=kind, subkind=subkind, reason=reason,
            latency_ms=self._typical.latency_ms if latency is None else latency,
            input_tokens=_int(column.input_tokens[i]),
            output_tokens=_int(column.output_tokens[i]),
            retry_after_ms=_int(column.retry_after[i]),
        )

    def reply(self, model: str, provider: str, at_ms: int) -> tuple[Reply, bool]:
        """The recorded outcome for this call (see the module docstring)."""
        column = self._recorder._models.get(model)
        if column is None or (self._mode == "time" and at_ms > self._end_ms):
            return self._typical, False
        if self._mode == "sequence":
            i = self._next.get(model, 0)
            if i >= len(column.times):
                return self._typical, False
            self._next[model] = i + 1
            return self._reply(column, i), True
        times = column.times
        relative = at_ms - self._start_ms
        i = bisect.bisect_left(times, relative)
        if i == len(times) or (i > 0 and relative - times[i - 1] <= times[i] - relative):
            i -= 1
        return self._reply(column, i), True


def record_trace(trace: Trace) -> TraceRecorder:
    """A trace in memory, recorded (what the streamed reader builds attempt by attempt)."""
    recorder = TraceRecorder()
    for attempt in trace.attempts:
        recorder.add_attempt(attempt)
    for arrival in trace.arrivals:
        recorder.add_arrival(arrival)
    return recorder


def recording_end(trace: Trace) -> int:
    """Milliseconds after the start of the recording's last event (the end of its last attempt,
    or its last arrival); the export time (`endMs`) only for a trace without events. A worker
    that stopped after its last call (`ledger demo`, a cron `--once` run) left no events after
    it, and the idle time until the export must not become simulated work."""
    return record_trace(trace).recording_end(trace.end_ms)


def trace_workload(trace: Trace, mode: ReplayMode = "time") -> Workload:
    """A trace as a workload: its arrivals (sizes from each source's first attempt)."""
    return record_trace(trace).workload(trace.start_ms, trace.end_ms, mode)
