"""Group commit: several store steps in one write transaction, each as if it ran alone (R-SRV-3).

A step is what one store write does inside its transaction (`run(conn, now)`), plus how its
result becomes the caller's answer once the transaction has committed (`answer(result, now)`,
e.g. a budget verdict becomes a reservation or `Refused`). `write_steps` runs the steps in the
order given, each in a savepoint of one write transaction: a step that fails with a ledger error
(an unknown reservation, a reused request id) is rolled back alone and answers with that error,
and every later step sees what the earlier ones wrote, exactly as if each had been a transaction
of its own in that order. Nothing is answered before the commit: if it fails (busy, disk full,
the connection lost), or a step fails in a way that is not the ledger's (a database error), every
step of the batch gets that error and nothing of the batch is written.

A batch of one runs without a savepoint, so the uncontended path costs what a single store
operation costs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection

from ledger.errors import LedgerError
from ledger.store.engine import Database

T = TypeVar("T")


def _as_is(result: Any, _now: int) -> Any:
    return result


@dataclass(frozen=True)
class Step(Generic[T]):
    """One store write: its work inside the transaction, and its answer after the commit."""

    run: Callable[[Connection, int], Any]
    answer: Callable[[Any, int], T] = _as_is


@dataclass(frozen=True)
class Answered(Generic[T]):
    """A step's outcome after the commit: its value, or the ledger error it answers with."""

    value: T | None = None
    error: LedgerError | None = None

    def get(self) -> T:
        """The value, or the step's error raised."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


def write_steps(db: Database, steps: Sequence[Step[Any]]) -> list[Answered[Any]]:
    """Run `steps` in order in one write transaction; their answers once it has committed.

    Raises (for the whole batch, nothing written) what the transaction itself raises."""
    results: list[tuple[Any, LedgerError | None]] = []
    with db.write() as txn:
        now = txn.now
        if len(steps) == 1:
            results.append((steps[0].run(txn.conn, now), None))
        else:
            for step in steps:
                try:
                    with txn.conn.begin_nested():
                        results.append((step.run(txn.conn, now), None))
                except LedgerError as error:
                    results.append((None, error))
    return [_answered(step, result, error, now) for step, (result, error) in zip(
        steps, results, strict=True)]


def _answered(step: Step[Any], result: Any, error: LedgerError | None, now: int) -> Answered[Any]:
    if error is not None:
        return Answered(error=error)
    try:
        return Answered(value=step.answer(result, now))
    except LedgerError as refused:
        return Answered(error=refused)
