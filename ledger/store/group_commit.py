"""Group commit for the service (R-SRV-3): requests that arrive while a write is in progress are
committed together by the next one, in arrival order, each checked as if it ran alone.

One committer thread does every reserve and settle of the service: a request hands it a step and
waits (the event loop awaits, a plain thread blocks) for the answer. While the committer writes a
batch, later steps queue; when it is done it takes everything queued (at most `MAX_BATCH`, oldest
first) into the next transaction (`Ledger.write_steps`). An uncontended request is a batch of
one; under load one lock turn and one fsync serve many requests. The database work thus never
runs on the event loop, and a request holds no transaction while it talks to its client.

Invariant: no step is answered before the transaction holding it has committed (or failed as a
whole: then every step of it gets that error); a step is in exactly one batch; batches are
written one at a time, in the order their steps arrived.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from ledger.store.batch import Answered, Step

T = TypeVar("T")
MAX_BATCH = 64
"""Steps per transaction at most: bounds how long one transaction holds the write lock."""


class GroupCommit:
    """The committer thread and its queue (see the module docstring)."""

    def __init__(
        self,
        write: Callable[[Sequence[Step[Any]]], list[Answered[Any]]],
        observe: Callable[[int], None] = lambda size: None,
    ) -> None:
        self._write = write
        self._observe = observe  # told the size of every batch written
        self._cv = threading.Condition()
        self._pending: list[tuple[Step[Any], Future[Any]]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._writing = 0  # steps in the transaction being written

    async def submit(self, step: Step[T]) -> T:
        """The step's answer, awaited on the event loop, once its transaction has committed.

        Cancelled before its batch was taken (the service stopping past its grace), the step is
        not written; once taken it is written with its batch, its answer lost on the way."""
        return await asyncio.wrap_future(self._queue(step))

    def run(self, step: Step[T]) -> T:
        """The same, for a plain thread: blocks until the answer."""
        return self._queue(step).result()  # type: ignore[no-any-return]

    def pending(self) -> int:
        """Steps queued behind the transaction being written (for the metrics and tests)."""
        with self._cv:
            return len(self._pending)

    def in_progress(self) -> int:
        """Steps in the transaction being written, 0 when none is (for the metrics and tests)."""
        with self._cv:
            return self._writing

    def close(self) -> None:
        """Write what is queued, then stop the committer thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _queue(self, step: Step[Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the committer is closed")
            self._pending.append((step, future))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._commit_loop, name="ledger-commit", daemon=True
                )
                self._thread.start()
            self._cv.notify()
        return future

    def _commit_loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                batch = self._pending[:MAX_BATCH]  # oldest first
                del self._pending[:MAX_BATCH]
                self._writing = len(batch)
            try:
                self._commit(batch)
            except BaseException as error:  # never leave a request waiting on a dead thread
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
            finally:
                with self._cv:
                    self._writing = 0

    def _commit(self, taken: list[tuple[Step[Any], Future[Any]]]) -> None:
        batch = [(step, future) for step, future in taken if future.set_running_or_notify_cancel()]
        if not batch:
            return
        try:
            answers = self._write([step for step, _ in batch])
        except BaseException as error:  # the whole transaction failed: nothing of it written
            for _, future in batch:
                future.set_exception(error)
        else:
            for (_, future), answer in zip(batch, answers, strict=True):
                if answer.error is not None:
                    future.set_exception(answer.error)
                else:
                    future.set_result(answer.value)
        self._observe(len(batch))
