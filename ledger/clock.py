"""The one seam where ledger reads wall-clock time; everything else takes `now` (UTC ms)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_ms() -> int:
    """Current UTC time in integer milliseconds."""
    return int(time.time() * 1000)


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
