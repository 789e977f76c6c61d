"""The one seam where ledger reads wall-clock time; everything else takes `now` (UTC ms).

A simulation (`ledger simulate`) runs the real code on a virtual clock: inside `virtual_time(fn)`
both `now_ms()` and `monotonic_s()` read `fn` in the current thread (a context variable), so no
code path reached from there reads the real clock.

Also the units of time: the window lengths in ms and the duration syntax of flags and the
policy file (`90s`, `15m`, `2h`, `7d`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta

from ledger.errors import UsageError

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


SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
MAX_DURATION_MS = 366 * DAY_MS

_UNITS: tuple[tuple[str, int], ...] = (
    ("d", DAY_MS),
    ("h", HOUR_MS),
    ("m", MINUTE_MS),
    ("s", SECOND_MS),
    ("ms", 1),
)

# Each unit at most once, in descending order, ASCII digits only (`\d` would admit other scripts).
# `m(?!s)` keeps "250ms" from being read as minutes followed by a dangling "s".
_DURATION = re.compile(
    r"(?:(?P<d>[0-9]{1,12})d)?"
    r"(?:(?P<h>[0-9]{1,12})h)?"
    r"(?:(?P<m>[0-9]{1,12})m(?!s))?"
    r"(?:(?P<s>[0-9]{1,12})s)?"
    r"(?:(?P<ms>[0-9]{1,12})ms)?"
)

_INVALID = (
    "invalid duration: use whole numbers with units d h m s ms, largest unit first, "
    "each at most once (e.g. 1h30m, 90s, 250ms, 2d), greater than zero and at most 366d"
)


def parse_duration_ms(text: str) -> int:
    """Parse an operator duration such as `1h30m` into milliseconds, or raise UsageError."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) and text else None
    if match is None or not any(match.groupdict().values()):
        raise UsageError(_INVALID)
    total = sum(int(match[unit]) * size for unit, size in _UNITS if match[unit] is not None)
    if not 0 < total <= MAX_DURATION_MS:
        raise UsageError(_INVALID)
    return total


def format_duration_ms(ms: int) -> str:
    """Compact text for a millisecond duration (`1h30m`, `45s`, `0s`; negative gets a `-`)."""
    if ms < 0:
        return "-" + format_duration_ms(-ms)
    if ms == 0:
        return "0s"
    parts: list[str] = []
    rest = ms
    for unit, size in _UNITS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def human_duration_ms(ms: int) -> str:
    """A duration as an operator reads it: the largest unit and the one below it, rounded down
    (`1h59m`, `4m59s`, `59s`, `388ms`), never more than the exact value."""
    if ms < 0:
        return "-" + human_duration_ms(-ms)
    if ms < SECOND_MS:
        return f"{ms}ms" if ms else "0s"
    sizes = _UNITS[:-1]  # d h m s: milliseconds only below one second
    first = next(i for i, (_unit, size) in enumerate(sizes) if ms >= size)
    count, rest = divmod(ms, sizes[first][1])
    text = f"{count}{sizes[first][0]}"
    if first + 1 < len(sizes):
        finer = rest // sizes[first + 1][1]
        if finer:
            text += f"{finer}{sizes[first + 1][0]}"
    return text
