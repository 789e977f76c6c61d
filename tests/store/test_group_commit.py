"""R-SRV-3 group commit: steps written together in one transaction, each as if it ran alone.

The store half (`Ledger.write_steps`) on both backends, and the service's leader/follower
committer (ledger/store/group_commit.py) with real store writes behind it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.errors import NotFoundError, Refused, UsageError
from ledger.records import Reservation, Success
from ledger.store.batch import Answered, Step
from ledger.store.group_commit import MAX_BATCH, GroupCommit
from tests.support.backends import BACKENDS, db_url, rows

pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)


@pytest.fixture
def committers() -> Iterator[Callable[..., GroupCommit]]:
    """GroupCommit objects for a test; each is closed after it (its thread ends)."""
    made: list[GroupCommit] = []

    def make(*args: Any, **kwargs: Any) -> GroupCommit:
        made.append(GroupCommit(*args, **kwargs))
        return made[-1]

    yield make
    for group in made:
        group.close()


def _count(ledger: Ledger, ledger_db: str | None) -> int:
    url = db_url(ledger.state.path, ledger_db)
    return int(rows(url, "SELECT count(*) FROM reservations")[0][0])


def test_r_srv_3_steps_are_checked_in_order_as_if_alone(
    make_ledger: Any, ledger_db: str | None
) -> None:
    """Three reserves for the last two slots of the hour, a settle of one reserved in the same
    batch, and a settle of an unknown reservation: the first two are granted, the third refused
    for the hour (it saw the two before it), the settle finds the reservation written before it,
    and the unknown one answers alone without undoing the others."""
    led: Ledger = make_ledger(callsPerHour=2)
    answers = led.write_steps([
        led.reserve_step("a", "alpha/small"),
        led.reserve_step("b", "alpha/small"),
        led.settle_step(1, Success(input_tokens=1, output_tokens=1)),
        led.settle_step(99, Success(input_tokens=1, output_tokens=1)),
        led.reserve_step("c", "alpha/small"),
    ])
    first, second = answers[0].get(), answers[1].get()
    assert (first.id, second.id) == (1, 2)
    assert answers[2].get().status == "succeeded"
    assert isinstance(answers[3].error, NotFoundError)
    assert isinstance(answers[4].error, Refused)
    assert answers[4].error.reason == "shared_hourly_budget"
    assert _count(led, ledger_db) == 2
    with pytest.raises(Refused):  # and the ledger agrees afterwards
        led.reserve("d", "alpha/small")


def test_r_srv_3_a_batch_that_fails_writes_nothing_and_answers_every_step(
    make_ledger: Any, ledger_db: str | None, committers: Callable[..., GroupCommit]
) -> None:
    """A step failing in a way that is not the ledger's (here: a bug; in life a database error)
    fails the whole transaction: the reserve before it is not written, every step of the batch
    gets the failure, none an answer."""
    led: Ledger = make_ledger()

    def broken(_conn: Any, _now: int) -> None:
        raise RuntimeError("boom")

    group = committers(led.write_steps)
    with pytest.raises(RuntimeError):
        led.write_steps([led.reserve_step("a", "alpha/small"), Step(broken)])
    assert _count(led, ledger_db) == 0
    with pytest.raises(RuntimeError):
        group.run(Step(broken))
    assert group.run(led.reserve_step("b", "alpha/small")).source == "b"  # it goes on
    assert _count(led, ledger_db) == 1


def test_r_srv_3_a_step_that_writes_then_fails_with_a_ledger_error_is_rolled_back_alone(
    make_ledger: Any, ledger_db: str | None
) -> None:
    """Issue 29 item 19: the savepoint. A step that has written a real reservation (its source,
    its hour's cost row) and then fails with a ledger error leaves nothing of it behind, while
    the steps before and after it in the batch are written and answered."""
    led: Ledger = make_ledger(callsPerHour=10)

    def writes_then_fails(conn: Any, now: int) -> None:
        led.reserve_step("gone", "alpha/small").run(conn, now)
        raise UsageError("refused after writing")

    answers = led.write_steps([
        led.reserve_step("a", "alpha/small"),
        Step(writes_then_fails),
        led.reserve_step("b", "alpha/small"),
    ])  # fmt: skip
    assert (answers[0].get().source, answers[2].get().source) == ("a", "b")
    assert isinstance(answers[1].error, UsageError)
    url = db_url(led.state.path, ledger_db)
    assert sorted(rows(url, "SELECT source_id FROM reservations")) == [("a",), ("b",)]
    assert sorted(rows(url, "SELECT id FROM sources")) == [("a",), ("b",)]
    assert rows(url, "SELECT sum(attempts) FROM cost_hours") == [(2,)]
    assert led.reserve("gone", "alpha/small").source == "gone"  # no trace of it: a new source


class _HeldFirstBatch:
    """A writer whose first transaction waits until released, so later steps pile up behind it."""

    def __init__(self, write: Callable[[Sequence[Step[Any]]], list[Answered[Any]]]) -> None:
        self.write = write
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls = 0

    def __call__(self, steps: Sequence[Step[Any]]) -> list[Answered[Any]]:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.release.wait(60)
        return self.write(steps)


def _held_first(
    committers: Callable[..., GroupCommit], led: Ledger, source: str, sizes: list[int]
) -> tuple[GroupCommit, _HeldFirstBatch, threading.Thread]:
    """A committer whose first batch (one reserve of `source`, from a thread) is being written
    and held there until `held.release` is set; batch sizes are appended to `sizes`."""
    held = _HeldFirstBatch(led.write_steps)
    group = committers(held, observe=sizes.append)
    first = threading.Thread(target=lambda: group.run(led.reserve_step(source, "alpha/small")))
    first.start()
    assert held.entered.wait(60)
    return group, held, first


def _queued(
    group: GroupCommit, steps: list[Step[Reservation]]
) -> tuple[list[threading.Thread], dict[int, Any]]:
    """One thread per step, each started once the one before it waits in the group (behind a
    batch being written), so their arrival order is the list's."""
    answers: dict[int, Any] = {}
    threads = []
    for index, step in enumerate(steps):
        def run(index: int = index, step: Step[Reservation] = step) -> None:
            try:
                answers[index] = group.run(step)
            except Exception as error:
                answers[index] = error

        thread = threading.Thread(target=run)
        before = group.pending()
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 60  # queued behind the held batch before the next starts
        while group.pending() == before and time.monotonic() < deadline:
            time.sleep(0.001)
    return threads, answers


def test_r_srv_3_requests_arriving_together_commit_together_in_arrival_order(
    make_ledger: Any, ledger_db: str | None, committers: Callable[..., GroupCommit]
) -> None:
    """Eight reserves for four slots: the first leads a transaction that is held; the seven
    arriving meanwhile wait (none answered before a commit) and are then written in one
    transaction, in arrival order: exactly the first four arrivals are granted."""
    led: Ledger = make_ledger(callsPerHour=4)
    sizes: list[int] = []
    group, held, first = _held_first(committers, led, "s0", sizes)
    threads, answers = _queued(
        group, [led.reserve_step(f"s{i}", "alpha/small") for i in range(1, 8)]
    )
    assert group.pending() == 7
    time.sleep(0.05)
    assert not answers  # nothing answered before the held transaction commits
    assert all(t.is_alive() for t in threads)
    held.release.set()
    for thread in [first, *threads]:
        thread.join(60)
    granted = [i for i, a in answers.items() if isinstance(a, Reservation)]
    refused = [i for i, a in answers.items() if isinstance(a, Refused)]
    assert sorted(granted) == [0, 1, 2]  # s0 (the first batch) took one slot of four
    assert sorted(refused) == [3, 4, 5, 6]
    assert sizes == [1, 7]
    assert _count(led, ledger_db) == 4


def test_r_srv_3_a_batch_holds_at_most_max_batch_steps(
    make_ledger: Any, ledger_db: str | None, committers: Callable[..., GroupCommit]
) -> None:
    """More steps waiting than one transaction takes: they go in batches of MAX_BATCH, oldest
    first, and every step is answered exactly once."""
    led: Ledger = make_ledger(callsPerHour=10_000)
    sizes: list[int] = []
    group, held, first = _held_first(committers, led, "s", sizes)
    count = MAX_BATCH + 6
    threads, answers = _queued(
        group, [led.reserve_step(f"q{i}", "alpha/small") for i in range(count)]
    )
    held.release.set()
    for thread in [first, *threads]:
        thread.join(60)
    assert sizes[:2] == [1, MAX_BATCH]
    assert sum(sizes) == count + 1
    ids = sorted(a.id for a in answers.values())
    assert ids == list(range(2, count + 2))
    by_arrival = [answers[i].id for i in range(count)]
    assert by_arrival == sorted(by_arrival)  # written in arrival order


def test_r_srv_3_a_request_cancelled_before_its_batch_is_not_written(
    make_ledger: Any, ledger_db: str | None, committers: Callable[..., GroupCommit]
) -> None:
    """The service stops past its grace while a reserve waits behind a transaction: the
    cancelled request's step is dropped, not written unanswered; one awaited alongside it is
    written and answered once its transaction commits."""
    led: Ledger = make_ledger()
    group, held, first = _held_first(committers, led, "first", [])

    async def cancel_one() -> Reservation:
        dropped = asyncio.ensure_future(group.submit(led.reserve_step("dropped", "alpha/small")))
        kept = asyncio.ensure_future(group.submit(led.reserve_step("kept", "alpha/small")))
        while group.pending() < 2:
            await asyncio.sleep(0.001)
        dropped.cancel()
        held.release.set()
        return await asyncio.wait_for(kept, 60)

    assert asyncio.run(cancel_one()).source == "kept"
    first.join(60)
    url = db_url(led.state.path, ledger_db)
    assert sorted(r[0] for r in rows(url, "SELECT source_id FROM reservations")) == [
        "first", "kept"]


def test_r_srv_3_the_committer_survives_a_broken_answer(
    make_ledger: Any, ledger_db: str | None, committers: Callable[..., GroupCommit]
) -> None:
    """A writer that answers wrongly (here: one answer short; in life a bug) fails that batch's
    requests with its error instead of killing the committer thread, so later requests are still
    served (was: the thread died and every later request waited for ever)."""
    led: Ledger = make_ledger()
    broken = [True]

    def one_short(steps: Sequence[Step[Any]]) -> list[Answered[Any]]:
        answers = led.write_steps(steps)
        if broken:
            broken.pop()
            return answers[:-1]
        return answers

    group = committers(one_short)

    def answer(source: str) -> Reservation:
        step = led.reserve_step(source, "alpha/small")
        return asyncio.run(asyncio.wait_for(group.submit(step), 30))

    with pytest.raises(ValueError, match="zip"):
        answer("a")
    assert answer("b").source == "b"
