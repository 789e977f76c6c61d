"""The service's refusal counts (R-DIAG-1), kept in memory and added to the ledger in batches.

Invariant: counting a refusal touches memory only (a dict entry, on the event loop); at most one
flush is scheduled at a time, FLUSH_S after the first refusal it carries, and it adds everything
counted meanwhile as one step of the group committer (so it shares a transaction with the
reserves around it; refusal_counts.add_counts writes one row per minute, reason, scope and key).
A flood of refusals therefore costs the writer one small step a second, never a transaction per
refusal. A service that stops gracefully flushes what it holds; one killed loses at most the last
FLUSH_S of counts (they are diagnostics, not budgets).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable

from ledger.errors import LedgerError
from ledger.store.batch import Step
from ledger.store.refusal_counts import KEEP_MS, RefusalKey, add_counts, minute_of

FLUSH_S = 1.0


def _step(counts: Counter[RefusalKey]) -> Step[None]:
    return Step(lambda conn, now: add_counts(conn, now, counts))


class RefusalTally:
    """Refusals counted since the last flush, and the one scheduled flush (see the module)."""

    def __init__(
        self,
        submit: Callable[[Step[None]], Awaitable[None]],
        run: Callable[[Step[None]], None],
        flush_s: float = FLUSH_S,
    ) -> None:
        self._submit = submit  # the group committer, awaited on the event loop
        self._run = run  # the same, blocking: the last flush while the loop shuts down
        self._flush_s = flush_s
        self._counts: Counter[RefusalKey] = Counter()
        self._task: asyncio.Task[None] | None = None

    def count(self, now_ms: int, reason: str, scope: str | None, key_name: str | None) -> None:
        """One refusal at ledger time `now_ms`; a flush is scheduled if none is."""
        self._counts[RefusalKey(minute_of(now_ms), reason, scope or "", key_name or "")] += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flush_later())

    def pending(self) -> int:
        """Refusals counted and not yet flushed."""
        return sum(self._counts.values())

    def _take(self) -> Counter[RefusalKey]:
        counts, self._counts = self._counts, Counter()
        return counts

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(self._flush_s)
        except asyncio.CancelledError:  # the service is stopping: write what is held, then go
            self._task = None
            counts = self._take()
            if counts:
                # the database gone or busy: nothing else to do with them
                with contextlib.suppress(LedgerError):
                    self._run(_step(counts))
            raise
        self._task = None
        counts = self._take()
        try:
            await self._submit(_step(counts))
        except LedgerError:  # busy or unreachable: keep them (at most KEEP_MS) for the next flush
            newest = max(counts).minute_ms
            self._counts.update({k: n for k, n in counts.items() if k.minute_ms > newest - KEEP_MS})
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._flush_later())
