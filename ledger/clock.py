"""The one seam where ledger reads wall-clock time; everything else takes `now` (UTC ms)."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_ms() -> int:
    """Current UTC time in integer milliseconds."""
    return int(time.time() * 1000)


def iso(ms: int | None) -> str | None:
    """ISO 8601 UTC text for a millisecond timestamp (None stays None)."""
    if ms is None:
        return None
    return (
        datetime.fromtimestamp(ms / 1000, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
