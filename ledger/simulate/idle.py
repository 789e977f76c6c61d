"""Skipping idle virtual time (R-SIM-4): where a `--loop` worker would wake again and again and
find nothing, the simulator moves the clock straight to the wake that finds something.

A worker that finds nothing due sleeps `max(floor, min(cap, due - now))` (`ledger.worker.drain`: at
most `cap`, 30 s, and no later than the soonest retry or lease expiry `due`) and polls again; an
arrival is seen at the first poll at or after it. Those polls read and write nothing a later
decision depends on, so jumping over them gives the same run as stepping through them, only
without the cost (a trace with a month of quiet in it no longer takes hours of CPU).

Invariant: pure arithmetic over the worker's own wake rule; no clock, no I/O.
"""

from __future__ import annotations


def busy_poll(first_ms: int, due_ms: int | None, arrival_ms: int | None, cap_ms: int,
              floor_ms: int) -> int | None:
    """The first of the worker's polls (from `first_ms` on) at which a source is due (`due_ms`)
    or has arrived (`arrival_ms`); None when neither will ever happen."""
    events = [t for t in (due_ms, arrival_ms) if t is not None]
    if not events:
        return None
    event = min(events)
    t = first_ms
    if t >= event:
        return t
    steps = -(-(event - t) // cap_ms)  # whole sleeps of `cap_ms` to reach the event
    if due_ms is not None:
        steps = min(steps, (due_ms - t) // cap_ms)  # sleeps stay whole while `due` is far
    t += steps * cap_ms
    if t >= event:
        return t
    assert due_ms is not None  # the sleep before `due` is shortened to land on it
    return t + max(floor_ms, due_ms - t)


def last_poll_until(first_ms: int, end_ms: int, cap_ms: int) -> int | None:
    """The last idle poll at or before `end_ms` (polls `cap_ms` apart from `first_ms`)."""
    if first_ms > end_ms:
        return None
    return first_ms + (end_ms - first_ms) // cap_ms * cap_ms
