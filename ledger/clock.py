"""The one seam where ledger reads wall-clock time; everything else takes `now` (UTC ms).

A simulation (`ledger simulate`) runs the real code on a virtual clock: inside `virtual_time(fn)`
both `now_ms()` and `monotonic_s()` read `fn` in the current thread (a context variable), so no
code path reached from there reads the real clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_VIRTUAL: ContextVar[Callable[[], int] | None] = ContextVar("ledger_virtual_time", default=None)


def now_ms() -> int:
    """Current UTC time in integer milliseconds."""
    virtual = _VIRTUAL.get()
    if virtual is not None:
        return virtual()
    return int(time.time() * 1000)


def monotonic_s() -> float:
    """Seconds on a clock that never steps back (for measuring elapsed time)."""
    virtual = _VIRTUAL.get()
    if virtual is not None:
        return virtual() / 1000
    return time.monotonic()


@contextmanager
def virtual_time(now: Callable[[], int]) -> Iterator[None]:
    """Inside, `now_ms()` and `monotonic_s()` read `now` (UTC ms) instead of the real clocks."""
    token = _VIRTUAL.set(now)
    try:
        yield
    finally:
        _VIRTUAL.reset(token)


def iso(ms: int | None) -> str | None:
    """ISO 8601 UTC text for a millisecond timestamp (None stays None)."""
    if ms is None:
        return None
    moment = EPOCH + timedelta(milliseconds=ms)  # integer arithmetic: ms / 1000 may round off
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso_ms(text: str | None) -> int | None:
    """The millisecond timestamp `iso()` wrote (exact: integer arithmetic, no float seconds)."""
    if text is None:
        return None
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (moment - EPOCH) // timedelta(milliseconds=1)
