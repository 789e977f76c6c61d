"""Stopping the worker: SIGINT/SIGTERM become a stop request, and during a handler's call they
cancel it (`CallCancelled`): the attempt is settled `cancelled`, no failure is added (R-Q-4)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["CallCancelled", "Stopper"]


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
