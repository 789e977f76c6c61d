"""Lease heartbeat: keeps a worker's lease alive while a handler's commit runs (R-Q-1, R-Q-2).

Invariant: each renewal is its own short write transaction through the ledger's `renew` (never a
transaction held open across the commit); once a renewal finds the lease lost, `lost` stays set
and the heartbeat stops renewing, so the worker never finishes a source another worker now holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ledger.errors import LedgerError

MIN_INTERVAL_S = 0.05
"""The shortest pause between renewals (a tiny leaseMs must not spin the write lock)."""
BEATS_PER_LEASE = 4
"""Renewals per lease: the lease is renewed with three quarters of it still to run, so two
renewals in a row may wait for the write lock (or fail busy) before it could expire. With the
policy's floor (MIN_LEASE_MS, 1 s) that is every 250 ms (issue 20 item 2)."""


class LeaseHeartbeat:
    """Renews one lease every leaseMs/4 on a daemon thread until stopped."""

    def __init__(self, renew: Callable[[], bool], lease_ms: int) -> None:
        self._renew = renew
        self._interval_s = max(MIN_INTERVAL_S, lease_ms / 1000 / BEATS_PER_LEASE)
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-lease", daemon=True)

    @property
    def lost(self) -> bool:
        """True once a renewal found the lease taken (expired and claimed, or released)."""
        return self._lost.is_set()

    def renew(self) -> bool:
        """One renewal now; False (and `lost` set) when the lease is no longer ours."""
        if self._lost.is_set():
            return False
        try:
            held = self._renew()
        except LedgerError:  # busy: try again at the next beat, the lease is still running
            return True
        if not held:
            self._lost.set()
        return held

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if not self.renew():
                return

    @contextmanager
    def running(self) -> Iterator[LeaseHeartbeat]:
        """Renew in the background while inside; stopped (and joined) on the way out."""
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()
