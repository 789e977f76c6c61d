"""`ledger trace export` (R-SIM-2): read a ledger's history through the store and build its trace.

Invariant: one read transaction (`store.history.read_history`); nothing is written.
"""

from __future__ import annotations

from ledger.api import Ledger
from ledger.errors import UsageError
from ledger.simulate.limits import MAX_ENTRIES, MAX_SPAN_MS
from ledger.simulate.trace import Trace, trace_from_history
from ledger.store.history import read_history


def export_trace(ledger: Ledger, window_ms: int | None = None) -> Trace:
    """The ledger's attempts and arrivals of the last `window_ms` (all when None) as a trace;
    never more than the longest span a simulation replays (R-SIM-4: 31 days)."""
    window = MAX_SPAN_MS if window_ms is None else min(window_ms, MAX_SPAN_MS)
    history = read_history(ledger.db, window)
    if max(len(history.attempts), len(history.arrivals)) > MAX_ENTRIES:
        raise UsageError(
            f"more than {MAX_ENTRIES} attempts or arrivals in that window (the most a trace "
            "holds, R-SIM-4); export a shorter one with --since"
        )
    return trace_from_history(history)
