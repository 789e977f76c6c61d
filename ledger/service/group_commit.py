"""Group commit for the service (R-SRV-3): requests that arrive while a write is in progress are
committed together by the next one, in arrival order, each checked as if it ran alone.

Leader and followers, no thread of its own: a request thread appends its step to the pending
list; when no batch is being written it becomes the leader, takes everything pending (at most
`MAX_BATCH`, oldest first) and writes it in one transaction (`Ledger.write_steps`); meanwhile
later requests wait. When the batch has committed (or failed as a whole) the leader hands every
step its answer and wakes the waiters: one whose step was answered returns it, the first of the
others becomes the next leader. An uncontended request is thus its own leader and costs what a
direct call costs; under load, one lock turn and one fsync serve many requests.

Invariant: no step is answered before the transaction holding it has committed; a step is in
exactly one batch; batches are written one at a time, in the order their steps arrived.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ledger.store.batch import Answered, Step

T = TypeVar("T")
MAX_BATCH = 64
"""Steps per transaction at most: bounds how long one transaction holds the write lock."""


class _Item:
    __slots__ = ("answer", "failure", "step")

    def __init__(self, step: Step[Any]) -> None:
        self.step = step
        self.answer: Answered[Any] | None = None
        self.failure: BaseException | None = None  # the whole batch failed with this


class GroupCommit:
    """Batches concurrent steps into one write transaction each (see the module docstring)."""

    def __init__(
        self,
        write: Callable[[Sequence[Step[Any]]], list[Answered[Any]]],
        observe: Callable[[int], None] = lambda size: None,
    ) -> None:
        self._write = write
        self._observe = observe  # told the size of every batch written
        self._cv = threading.Condition()
        self._pending: list[_Item] = []
        self._writing = False

    def run(self, step: Step[T]) -> T:
        """The step's answer once the transaction that wrote it has committed (or its error)."""
        item = _Item(step)
        with self._cv:
            self._pending.append(item)
        while True:
            with self._cv:
                while self._writing and not _done(item):
                    self._cv.wait()
                if _done(item):
                    break
                batch = self._pending[:MAX_BATCH]  # oldest first; ours may be in a later one
                del self._pending[:MAX_BATCH]
                self._writing = True
            self._lead(batch)
        if item.failure is not None:
            raise item.failure
        assert item.answer is not None
        return item.answer.get()  # type: ignore[no-any-return]

    def pending(self) -> int:
        """Steps waiting for a batch (for tests and the metrics)."""
        with self._cv:
            return len(self._pending)

    def _lead(self, batch: list[_Item]) -> None:
        try:
            answers = self._write([item.step for item in batch])
        except BaseException as error:  # the whole transaction failed: nothing of it written
            for item in batch:
                item.failure = error
        else:
            for item, answer in zip(batch, answers, strict=True):
                item.answer = answer
        finally:
            with self._cv:
                self._writing = False
                self._cv.notify_all()
        self._observe(len(batch))


def _done(item: _Item) -> bool:
    return item.answer is not None or item.failure is not None

