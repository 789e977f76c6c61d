"""The virtual clock a simulation runs on (R-SIM-1): time moves only when the simulation says so.

Invariant: `now()` never moves backwards and never reads the wall clock.
"""

from __future__ import annotations


class VirtualClock:
    """UTC milliseconds that advance only through `advance` / `advance_to`."""

    def __init__(self, start_ms: int) -> None:
        self._now = start_ms

    def now(self) -> int:
        """The current virtual time (UTC ms)."""
        return self._now

    def advance(self, ms: int) -> int:
        """Move forward by `ms` (negative moves nothing); returns the new time."""
        self._now += max(0, ms)
        return self._now

    def advance_to(self, at_ms: int) -> int:
        """Move forward to `at_ms` (an earlier time moves nothing); returns the new time."""
        self._now = max(self._now, at_ms)
        return self._now
