"""The attempt protocol (ledger.attempt) settles every reservation exactly once, whichever driver
runs it: the worker's queue item (R-POL-4) and the gateway's request loop (R-GW-2, R-GW-4).

One table of outcomes, run through both drivers with a real `Ledger` on a migrated SQLite file:
a success, a classified failure and its permitted follow-up, an exception from the call, and a
cancel (R-Q-4: SIGINT/SIGTERM during the handler's call; R-GW-7: the caller left). For each, every
settle the driver sends is counted per reservation, and the database is read after: each
reservation made was settled exactly once and none is left `open` (R-RES-11: an open one would
count until its deadline). The record's own guard (`Attempt.settling`) refuses a second settle.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from ledger.api import Ledger
from ledger.attempt import Attempt, SettledTwice, cancelled, settle, success
from ledger.classify import Classification
from ledger.gateway import loop, routing
from ledger.gateway.formats import Format
from ledger.gateway.upstream import Reply
from ledger.kinds import AttemptRole, AttemptStatus, FailureKind
from ledger.providers.base import ProviderResponse
from ledger.records import Outcome, Reservation
from ledger.store import queue as q
from ledger.store import sqlite_driver
from ledger.store.group_commit import GroupCommit
from ledger.worker.handler import Job
from ledger.worker.item import run_item
from ledger.worker.queue import HandlerResult, ItemOutcome
from ledger.worker.stop import CallCancelled
from tests.support.gateway_setup import MINIMAL_COMPLETION as DOCUMENT
from tests.support.gateway_setup import STANDIN_KEY, gateway_catalog
from tests.support.gateway_setup import UNREACHED_UPSTREAM as UPSTREAM

OUTCOMES = ["success", "failure_then_follow_up", "exception", "cancel"]


@pytest.fixture
def ledger(home: Path) -> Iterator[Ledger]:
    (home / "catalog.json").write_text(json.dumps(gateway_catalog(UPSTREAM)))  # type: ignore[arg-type]
    opened = Ledger.open(home, env={"BOLT_KEY": STANDIN_KEY})
    try:
        yield opened
    finally:
        opened.close()


def _count_settles(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Every settle either driver sends (the worker's `settle`, the gateway's `settle_step` for
    the group committer), counted per reservation id."""
    sent: Counter[int] = Counter()

    def counted(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(reservation_id: int, outcome: Outcome, **kwargs: Any) -> Any:
            sent[reservation_id] += 1
            return real(reservation_id, outcome, **kwargs)

        return wrapper

    monkeypatch.setattr(ledger, "settle", counted(ledger.settle))
    monkeypatch.setattr(ledger, "settle_step", counted(ledger.settle_step))
    return sent


def _stored(home: Path) -> dict[int, str]:
    with sqlite_driver.connect(home / "ledger.db") as db:
        return dict(db.execute("SELECT id, status FROM reservations"))


def _assert_settled_once(home: Path, sent: Counter[int], made: int) -> None:
    stored = _stored(home)
    assert len(stored) == made
    assert dict(sent) == dict.fromkeys(stored, 1)  # one settle per reservation, none skipped
    assert AttemptStatus.OPEN.value not in stored.values()


# --------------------------------------------------------------------------- the worker


def _worker_handler(outcome: str) -> Callable[[Job], HandlerResult]:
    def handler(job: Job) -> HandlerResult:
        if outcome == "success":
            return HandlerResult.success()
        if outcome == "failure_then_follow_up":
            if job.role is AttemptRole.CORRECTION:  # the follow-up the failure permitted
                return HandlerResult.success()
            return HandlerResult.failure(FailureKind.INVALID_OUTPUT, "json_contract")
        if outcome == "exception":
            raise RuntimeError("the handler's own bug")  # classified by type only
        raise CallCancelled  # what the Stopper raises inside the call on SIGINT/SIGTERM

    return handler


WORKER_ENDS = {
    "success": (ItemOutcome.DONE, 1),
    "failure_then_follow_up": (ItemOutcome.DONE, 2),
    "exception": (ItemOutcome.FAILED, None),  # a follow-up only if the policy permits one
    "cancel": (ItemOutcome.CANCELLED, 1),
}


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_r_pol_4_r_q_4_the_worker_settles_each_reservation_exactly_once(
    ledger: Ledger, home: Path, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    sent = _count_settles(ledger, monkeypatch)
    ledger.add_source("s", "payload of s")
    claim = q.claim(ledger.db, "w", ledger.policy.lease_ms)
    assert claim is not None
    report = run_item(ledger, claim, _worker_handler(outcome))
    ended, attempts = WORKER_ENDS[outcome]
    assert report.outcome is ended
    if attempts is not None:
        assert len(report.attempts) == attempts
    _assert_settled_once(home, sent, len(report.attempts))
    assert len(report.attempts) >= 1


# --------------------------------------------------------------------------- the gateway

LIMITED = Classification(FailureKind.RATE_LIMIT, "http_429", retry_after_ms=600_000)


def _serve(ledger: Ledger, outcome: str) -> tuple[loop.Answered | BaseException, int]:
    """loop.run with a scripted exchange in place of the upstream: the answer (or what it
    raised) and how many exchanges ran."""
    calls: list[str] = []
    request = routing.Request("gw-s", "acme/a1", Format.OPENAI, 100, None, (), True)

    async def exchange(ctx: loop.Context, attempt: loop.Attempt) -> Reply:
        calls.append(attempt.route)
        answer = Reply(DOCUMENT, ProviderResponse(ok=True, status=200, input_tokens=3,
                                                  output_tokens=2), None)  # fmt: skip
        if outcome == "success" or (outcome == "failure_then_follow_up" and attempt.number > 1):
            return answer
        if outcome == "failure_then_follow_up":
            return Reply(None, None, LIMITED)  # the provider cools: a fallback is permitted
        if outcome == "exception":
            raise RuntimeError("the exchange broke")
        scopes[0].cancel()  # the caller left (R-GW-7)
        await anyio.sleep_forever()
        raise AssertionError("not reached")

    scopes: list[anyio.CancelScope] = []

    async def run() -> loop.Answered | BaseException:
        scope = anyio.CancelScope()
        scopes.append(scope)
        group = GroupCommit(ledger.write_steps)
        try:
            async with httpx.AsyncHTTPTransport() as upstream:
                ctx = loop.Context(ledger, group, upstream)
                try:
                    with scope:
                        return await loop.run(ctx, request, {"model": request.model}, exchange)
                except RuntimeError as error:
                    return error
                return anyio.get_cancelled_exc_class()()  # cancelled: run never returned
        finally:
            group.close()

    return anyio.run(run), len(calls)


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_r_gw_4_r_gw_7_the_gateway_settles_each_reservation_exactly_once(
    ledger: Ledger, home: Path, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    sent = _count_settles(ledger, monkeypatch)
    answered, calls = _serve(ledger, outcome)
    if outcome in ("success", "failure_then_follow_up"):
        assert isinstance(answered, loop.Answered)
        assert answered.attempt.number == calls == (1 if outcome == "success" else 2)
        assert answered.attempt.settled is not None
        if outcome == "failure_then_follow_up":
            assert answered.attempt.role is AttemptRole.FALLBACK
    else:
        assert not isinstance(answered, loop.Answered)
        assert calls == 1
    _assert_settled_once(home, sent, calls)


# --------------------------------------------------------------------------- the record


def test_an_attempt_refuses_a_second_settle(ledger: Ledger) -> None:
    """The record's guard: a driver that settled an attempt cannot settle it again."""
    reservation: Reservation = ledger.reserve("s", "acme/a1", input_bytes=10)
    attempt = Attempt(1, reservation.model, reservation, reservation.model, None)
    settled = settle(attempt, success(None), ledger.settle)
    assert attempt.settled is settled
    assert attempt.report().kind is None
    with pytest.raises(SettledTwice):
        settle(attempt, cancelled(), ledger.settle)
    assert attempt.settled is settled
