"""Issue 12 items 1-5 and 9: no lost result, no rerun of a finished source, no double commit,
the owed alternate after the 2nd output failure, a reported `cancelled` is the cancelled row.

R-Q-1, R-Q-2, R-RES-3, R-RES-11, R-HTTP-3, SPEC 8 (invalid_output), R-POL-4.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.api import Ledger
from ledger.classify import classify_kind
from ledger.errors import Refused
from ledger.kinds import AttemptRole, FailureKind
from ledger.records import Failed, Success
from ledger.standin.server import Scripted, StandIn
from ledger.store import queue as q
from ledger.store import sqlite_driver
from ledger.worker.drain import drain
from ledger.worker.handler import Job, echo_handler
from ledger.worker.item import run_item
from ledger.worker.queue import HandlerResult, ItemOutcome, ItemReport
from tests.support.backends import BACKENDS
from tests.support.backends import rows as stored
from tests.support.ledgers import Clock, LedgerFactory
from tests.support.queue_setup import ROOT, cli_env, db_rows, open_ledger, standin_home, worker_argv

Handler = Callable[[Job], HandlerResult]


def _item(led: Ledger, handler: Handler, worker: str = "w") -> ItemReport:
    claim = q.claim(led.db, worker, led.policy.lease_ms)
    assert claim is not None
    return run_item(led, claim, handler)


def _state(led: Ledger, source: str = "s") -> tuple[str, str | None]:
    row = db_rows(led.state.path, "SELECT state, lease_owner FROM sources WHERE id = ?", source)
    return row[0][0], row[0][1]


def _rival_takes_the_lease(led: Ledger) -> None:
    """The lease runs out (e.g. a stalled process) and another worker claims the source."""
    db_rows_write(led, "UPDATE sources SET lease_expires_ms = 0")
    assert q.claim(led.db, "rival", 60_000) is not None


# --------------------------------------------------------------------------- item 1 (R-Q-1)


def test_issue12_item1_a_failed_commit_keeps_the_source_and_the_worker_goes_on(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(defaultModel="alpha/small")
    led.add_source("a", "payload a")
    led.add_source("b", "payload b")
    committed: list[str] = []
    refuse_once = {"a"}

    def handler(job: Job) -> HandlerResult:
        clock.advance(1)

        def commit() -> None:
            if job.source_id in refuse_once:
                refuse_once.discard(job.source_id)
                raise OSError("the handler's own store is full")
            committed.append(job.source_id)

        return HandlerResult.success(commit=commit)

    first = drain(led, handler, worker_id="w", max_items=2)
    assert (first.done, first.commit_failed, first.items) == (1, 1, 2)
    assert first.exit_code() == 0
    assert committed == ["b"]
    assert _state(led, "a") == ("queued", None)  # nothing finished, claimable again
    assert _state(led, "b") == ("done", None)
    rows = db_rows(led.state.path, "SELECT source_id, status FROM reservations ORDER BY id")
    assert rows == [("a", "succeeded"), ("b", "succeeded")]  # the call itself succeeded
    clock.advance(60_001)  # after its backoff (issue 20 item 1)
    again = drain(led, handler, worker_id="w")
    assert again.done == 1
    assert committed == ["b", "a"]
    assert _state(led, "a") == ("done", None)


def test_issue12_item1_a_worker_killed_before_its_commit_loses_nothing(tmp_path: Path) -> None:
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        home = standin_home(tmp_path / "home", standin, leaseMs=1500, timeoutMs=1000)
        led = open_ledger(home)
        led.add_source("s", "payload")
        proc = subprocess.run(
            worker_argv(home, "--once", "--handler", "tests.support.procs:dying_commit_handler",
                        "--worker-id", "doomed"),
            cwd=ROOT, env=cli_env(), capture_output=True, timeout=120, check=False,
        )
        assert proc.returncode == 9, proc.stderr.decode()  # died inside commit
        assert db_rows(home, "SELECT status FROM reservations") == [("succeeded",)]
        assert _state(led) == ("leased", "doomed")  # not finished: the result was never taken
        expires = db_rows(home, "SELECT lease_expires_ms FROM sources")[0][0]
        while q.ledger_now(led.db) <= expires:
            time.sleep(0.05)
        summary = drain(led, echo_handler, worker_id="rescuer")
        led.close()
    assert summary.done == 1
    assert db_rows(home, "SELECT state, lease_owner FROM sources") == [("done", None)]


# --------------------------------------------------------------------------- item 2 (R-RES-3)


@pytest.mark.parametrize("finish", ["settle_finish", "source_done"])
@pytest.mark.parametrize("kind", [FailureKind.SAFETY, FailureKind.UNKNOWN])
def test_issue12_item2_a_finished_source_is_never_paused_nor_reopened(
    make_ledger: LedgerFactory, finish: str, kind: FailureKind
) -> None:
    led = make_ledger(defaultModel="alpha/small", sourceCalls=10)
    led.add_source("s", None)
    if kind is FailureKind.UNKNOWN:  # four failures: the 5th (below) reaches the failure cap
        for _ in range(4):
            led.settle(led.reserve("s", "alpha/small", override=True).id,
                       Failed(classify_kind(kind)))
    ok = led.reserve("s", "alpha/small", override=True)
    still_open = led.reserve("s", "alpha/small", override=True)
    if finish == "settle_finish":
        assert led.settle(ok.id, Success(finish=True)).finished
    else:
        led.settle(ok.id, Success())
        led.set_source_state("s", "done")
    result = led.settle(still_open.id, Failed(classify_kind(kind)))
    assert result.paused is None
    assert "not paused: the source is finished (R-RES-3)" in result.actions
    assert _state(led) == ("done", None)
    assert db_rows(led.state.path, "SELECT pause_reason FROM sources") == [(None,)]
    with pytest.raises(Refused) as resumed:
        led.set_source_state("s", "resume")
    assert resumed.value.reason == "source_settled"
    with pytest.raises(Refused) as again:
        led.reserve("s", "alpha/small", override=True)
    assert again.value.reason == "source_settled"


# --------------------------------------------------------------------------- item 3 (R-Q-2)


def test_issue12_item3_the_lease_covers_the_call_when_lease_ms_is_shorter(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(defaultModel="alpha/small", leaseMs=1000, timeoutMs=5000)
    led.add_source("s", None)
    rivals: list[object] = []
    committed: list[str] = []

    def slow(job: Job) -> HandlerResult:
        clock.advance(3000)  # past leaseMs, well within the reservation's deadline
        rivals.append(q.claim(led.db, "rival", 1000))
        return HandlerResult.success(commit=lambda: committed.append(job.source_id))

    report = _item(led, slow)
    assert rivals == [None]  # nobody could take the source during the call
    assert report.outcome is ItemOutcome.DONE
    assert committed == ["s"]


def _second_worker_meanwhile(
    home: Path, handler: str, env: dict[str, str], started: Callable[[], bool], after_ms: int
) -> tuple[subprocess.CompletedProcess[bytes], int, bytes, bytes]:
    """Worker A runs one item; once `started()` and `after_ms` of ledger time later (past its
    lease), worker B runs one item too. Returns B's result and A's exit code, stdout, stderr."""
    led = open_ledger(home)
    first = subprocess.Popen(
        worker_argv(home, "--once", "--json", "--handler", handler, "--worker-id", "A"),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        while not started() and first.poll() is None:
            time.sleep(0.02)
        since = q.ledger_now(led.db)
        while q.ledger_now(led.db) <= since + after_ms:
            time.sleep(0.05)
        second = subprocess.run(
            worker_argv(home, "--once", "--json", "--handler", handler, "--worker-id", "B"),
            cwd=ROOT, env=env, capture_output=True, timeout=120, check=False,
        )
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
        led.close()
    return second, first.returncode, out, err


def test_issue12_item3_a_second_worker_process_cannot_take_a_source_during_a_long_call(
    tmp_path: Path,
) -> None:
    reply = '{"ok": true}'
    log = tmp_path / "accepted.log"
    with StandIn({"m1": [Scripted(delay_s=6, text=reply)]}, Scripted(text=reply)) as standin:
        home = standin_home(tmp_path / "home", standin, leaseMs=1000, timeoutMs=10_000)
        led = open_ledger(home)
        led.add_source("s", "payload")
        env = cli_env(LEDGER_TEST_LOG=str(log))
        handler = "tests.support.queue_setup:appending_handler"
        second, code, out, err = _second_worker_meanwhile(
            home, handler, env, lambda: bool(standin.requests), 1500  # the call in flight
        )
        led.close()
    assert code == 0, err.decode()
    assert second.returncode == 0, second.stderr.decode()
    assert json.loads(second.stdout)["items"] == 0  # B found nothing to claim
    assert json.loads(out)["done"] == 1
    assert log.read_text().split() == ["s"]  # committed once
    assert len(standin.requests) == 1


def test_r_q_1_a_commit_slower_than_the_lease_keeps_it_and_commits_once(tmp_path: Path) -> None:
    """leaseMs 1 s, a 3 s commit: a second worker process started meanwhile claims nothing."""
    reply = '{"ok": true}'
    log = tmp_path / "commits.log"
    with StandIn({"m1": [Scripted(text=reply)]}, Scripted(text=reply)) as standin:
        home = standin_home(tmp_path / "home", standin, leaseMs=1000, timeoutMs=10_000)
        led = open_ledger(home)
        led.add_source("s", "payload")
        env = cli_env(LEDGER_TEST_LOG=str(log))
        handler = "tests.support.procs:slow_commit_handler"
        second, code, out, err = _second_worker_meanwhile(
            home, handler, env, lambda: log.exists() and bool(log.read_text()), 1500  # committing
        )
        led.close()
    assert code == 0, err.decode()
    assert second.returncode == 0, second.stderr.decode()
    assert json.loads(second.stdout)["items"] == 0  # B found nothing to claim
    assert json.loads(out)["done"] == 1
    assert log.read_text().split("\n") == ["start s", "s", ""]  # committed once
    assert len(standin.requests) == 1
    assert _state(led) == ("done", None)


def test_r_q_1_a_lease_lost_during_the_commit_does_not_finish_the_source(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(defaultModel="alpha/small")
    led.add_source("s", None)

    def robbed(job: Job) -> HandlerResult:
        def commit() -> None:  # the lease is lost mid-commit: another worker takes the source
            _rival_takes_the_lease(led)

        return HandlerResult.success(commit=commit)

    report = _item(led, robbed)
    assert report.outcome is ItemOutcome.LOST_LEASE
    assert _state(led) == ("leased", "rival")  # the new holder keeps it, unfinished


def test_issue12_item3_a_worker_whose_lease_was_lost_does_not_commit(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(defaultModel="alpha/small")
    led.add_source("s", None)
    committed: list[str] = []

    def robbed(job: Job) -> HandlerResult:
        # the lease is lost (e.g. a stalled process): another worker takes the source
        _rival_takes_the_lease(led)
        return HandlerResult.success(commit=lambda: committed.append(job.source_id))

    report = _item(led, robbed)
    assert report.outcome is ItemOutcome.LOST_LEASE
    assert committed == []
    assert _state(led) == ("leased", "rival")  # the new holder keeps it, unfinished


def test_issue12_item3_a_worker_that_lost_its_lease_before_the_call_sends_nothing(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(defaultModel="alpha/small")
    led.add_source("s", None)
    stale = q.claim(led.db, "w1", 60_000)
    assert stale is not None
    _rival_takes_the_lease(led)
    called: list[str] = []

    def handler(job: Job) -> HandlerResult:
        called.append(job.source_id)
        return HandlerResult.success()

    report = run_item(led, stale, handler)
    assert report.outcome is ItemOutcome.LOST_LEASE
    assert called == []
    assert db_rows(led.state.path, "SELECT status FROM reservations") == [("cancelled",)]
    assert db_rows(led.state.path, "SELECT failures FROM sources") == [(0,)]
    assert _state(led) == ("leased", "rival")


def db_rows_write(led: Ledger, sql: str) -> None:
    """A direct write to the ledger file (simulates what another process did)."""

    conn = sqlite_driver.connect(led.state.path / "ledger.db", timeout=10)
    try:
        with conn:
            conn.execute(sql)
    finally:
        conn.close()


@pytest.mark.parametrize("actions", [("resume",), ("pause", "resume")])
def test_issue12_item3_resume_does_not_release_a_live_lease(
    make_ledger: LedgerFactory, clock: Clock, actions: tuple[str, ...]
) -> None:
    led = make_ledger(leaseMs=60_000)
    led.add_source("s", None)
    assert q.claim(led.db, "w1", 60_000) is not None
    for action in actions:
        led.set_source_state("s", action)
    assert _state(led) == ("leased", "w1")
    assert q.claim(led.db, "w2", 60_000) is None  # never two holders
    assert q.renew(led.db, "s", "w1", 60_000)  # w1 still holds it
    assert q.release(led.db, "s", "w1")
    assert _state(led) == ("queued", None)
    clock.advance(1)
    assert q.claim(led.db, "w2", 60_000) is not None


def test_issue12_item3_pause_while_leased_then_release_then_resume(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(leaseMs=60_000)
    led.add_source("s", None)
    assert q.claim(led.db, "w1", 60_000) is not None
    led.set_source_state("s", "pause")
    assert not q.release(led.db, "s", "w1")  # the paused source stays paused ...
    assert _state(led) == ("paused", None)  # ... and the worker's lease is gone
    led.set_source_state("s", "resume")
    assert _state(led) == ("queued", None)
    clock.advance(1)
    assert q.claim(led.db, "w2", 60_000) is not None


def test_issue12_item3_a_source_paused_during_the_call_is_neither_committed_nor_finished(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    """`source pause` while a worker's call runs: the lease stays with the worker, but the pause
    wins over the result (review of issue 12: renew during a call vs `source pause`)."""
    led = make_ledger(defaultModel="alpha/small")
    led.add_source("s", "payload")
    committed: list[str] = []

    def handler(job: Job) -> HandlerResult:
        clock.advance(1)
        led.set_source_state("s", "pause")  # the operator, from another terminal
        return HandlerResult.success(commit=lambda: committed.append(job.source_id))

    report = _item(led, handler)
    assert report.outcome is ItemOutcome.PAUSED
    assert committed == []
    assert db_rows(led.state.path, "SELECT state, pause_reason, lease_owner FROM sources") == [
        ("paused", "manual", None)
    ]
    led.set_source_state("s", "resume")
    clock.advance(1)
    again = _item(led, lambda job: HandlerResult.success(commit=lambda: committed.append("2nd")))
    assert again.outcome is ItemOutcome.DONE  # resumed: the source runs again, nothing lost
    assert committed == ["2nd"]


def test_issue12_item3_a_source_paused_between_reserve_and_call_sends_nothing(
    make_ledger: LedgerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pause lands right after the reservation was granted: the call is not made."""
    led = make_ledger(defaultModel="alpha/small")
    led.add_source("s", "payload")
    granted = led.reserve

    def reserve_then_pause(*args: object, **kwargs: object) -> object:
        reservation = granted(*args, **kwargs)  # type: ignore[arg-type]
        led.set_source_state("s", "pause")  # the operator, from another terminal
        return reservation

    monkeypatch.setattr(led, "reserve", reserve_then_pause)
    calls: list[str] = []

    def handler(job: Job) -> HandlerResult:
        calls.append(job.source_id)
        return HandlerResult.success()

    report = _item(led, handler)
    assert calls == []
    assert report.outcome is ItemOutcome.PAUSED
    assert db_rows(led.state.path, "SELECT status FROM reservations") == [("cancelled",)]
    assert db_rows(led.state.path, "SELECT state, failures FROM sources") == [("paused", 0)]


def test_issue12_item3_an_expired_lease_is_released_by_resume(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(leaseMs=1000)
    led.add_source("s", None)
    assert q.claim(led.db, "w1", 1000) is not None
    led.set_source_state("s", "pause")
    clock.advance(1000)
    led.set_source_state("s", "resume")
    assert _state(led) == ("queued", None)
    assert not q.renew(led.db, "s", "w1", 1000)  # w1 lost it for good


# --------------------------------------------------------------------------- item 4 (R-HTTP-3)


def _push_ledger_time(led: Ledger, ahead_ms: int) -> None:
    """Another process with a fast clock writes: the ledger's newest stored time jumps ahead."""
    fast = Ledger.open(led.state.path, str(led.state.path / "ledger.db"), policy=led.policy,
                       catalog=led.catalog, env={},
                       clock=lambda: led.db.clock_fn() + ahead_ms)
    try:
        fast.add_source("written-by-a-fast-clock", None, enqueue=False)
    finally:
        fast.close()


def test_issue12_item4_the_http_deadline_is_the_reservations_deadline_in_ledger_time(
    tmp_path: Path,
) -> None:
    with StandIn({"m1": [Scripted(delay_s=8, text='{"ok": true}')]}) as standin:
        home = standin_home(tmp_path / "home", standin, timeoutMs=1000)
        led = open_ledger(home)
        led.add_source("s", "payload")
        _push_ledger_time(led, 120_000)
        report = _item(led, echo_handler)
        led.close()
    # the hanging provider is cut at the reservation's deadline, not 2 minutes later
    assert report.outcome is ItemOutcome.FAILED
    assert [(a.model, a.kind) for a in report.attempts] == [("p1/m1", "transport")]
    assert db_rows(home, "SELECT status, kind, subkind FROM reservations") == [
        ("failed", "transport", "timeout")
    ]


def test_issue12_item4_a_result_after_the_deadline_is_late_whatever_the_ledger_clock(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(defaultModel="alpha/small", timeoutMs=2000)
    led.add_source("s", None)
    _push_ledger_time(led, 60_000)
    committed: list[str] = []

    def hanging(job: Job) -> HandlerResult:
        assert 0 < job.remaining_ms() <= 2000  # from the reservation, not the local clock
        clock.advance(20_000)  # the call took 20 s under timeoutMs 2000
        return HandlerResult.success(commit=lambda: committed.append(job.source_id))

    report = _item(led, hanging)
    assert report.outcome is ItemOutcome.LATE
    assert committed == []
    assert db_rows(led.state.path, "SELECT status, late FROM reservations") == [("succeeded", 1)]
    assert _state(led) == ("queued", None)


# --------------------------------------------------------------------------- item 5 (SPEC 8)


def _invalid_on(bad: set[str]) -> Callable[[Job], HandlerResult]:
    def handler(job: Job) -> HandlerResult:
        if job.route in bad:
            return HandlerResult.failure(FailureKind.INVALID_OUTPUT, "json_contract")
        return HandlerResult.success()

    return handler


def _roles(report: ItemReport) -> list[tuple[str, str, str | None]]:
    return [(a.model, a.role.value, a.kind) for a in report.attempts]


def test_issue12_item5_the_second_output_failure_goes_to_an_alternate_model(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(defaultModel="alpha/small")
    led.add_source("s", None)
    handler = _invalid_on({"alpha/small"})
    first = _item(led, handler)
    assert _roles(first) == [
        ("alpha/small", "primary", "invalid_output"),
        ("alpha/small", "correction", "invalid_output"),
    ]
    second = _item(led, handler)  # the owed alternate, not the default model again
    assert _roles(second) == [("beta/mid", "fallback", None)]
    assert second.outcome is ItemOutcome.DONE
    assert db_rows(led.state.path, "SELECT fallback_from FROM reservations WHERE id = 3") == [
        ("alpha/small",)
    ]
    assert db_rows(led.state.path, "SELECT output_failures, state FROM sources") == [(2, "done")]


def test_issue12_item5_the_owed_alternate_survives_a_cancelled_item(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(defaultModel="alpha/small", sourceCalls=10)
    led.add_source("s", None)
    for role in (AttemptRole.PRIMARY, AttemptRole.CORRECTION):
        r = led.reserve("s", "alpha/small", role=role, override=True)
        led.settle(r.id, Failed(classify_kind(FailureKind.INVALID_OUTPUT, "json_contract")))
    fallback = led.reserve("s", "beta/mid", role=AttemptRole.FALLBACK, fallback_from="alpha/small")
    led.settle(fallback.id, Failed(classify_kind(FailureKind.CANCELLED)))
    report = _item(led, _invalid_on({"alpha/small"}))
    assert _roles(report) == [("beta/mid", "fallback", None)]


def test_issue12_item5_the_owed_alternate_survives_a_worker_killed_during_it(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    """The alternate's reservation expired unsettled (the worker died in the call, R-RES-11):
    no failure was recorded, so the alternate is still owed (review of item 5)."""
    led = make_ledger(defaultModel="alpha/small", sourceCalls=10, timeoutMs=1000)
    led.add_source("s", None)
    for role in (AttemptRole.PRIMARY, AttemptRole.CORRECTION):
        r = led.reserve("s", "alpha/small", role=role, override=True)
        led.settle(r.id, Failed(classify_kind(FailureKind.INVALID_OUTPUT, "json_contract")))
    led.reserve("s", "beta/mid", role=AttemptRole.FALLBACK, fallback_from="alpha/small")
    clock.advance(1001)  # never settled: it expires at its deadline
    report = _item(led, _invalid_on({"alpha/small"}))
    assert _roles(report) == [("beta/mid", "fallback", None)]


def test_issue12_item5_with_no_alternate_the_generic_backoff_comes_first(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(defaultModel="alpha/small", crossProviderFallback=False, sourceCalls=10)
    led.add_source("s", None)
    handler = _invalid_on({"alpha/small"})
    assert len(_item(led, handler).attempts) == 2  # primary + correction, both invalid
    deferred = _item(led, handler)
    assert deferred.outcome is ItemOutcome.FAILED
    assert deferred.attempts == ()  # no re-probe of the same model straight away
    assert deferred.retry_at_ms == clock.ms + 60_000  # R-POL-3 first step (jitter 0)
    assert db_rows(led.state.path, "SELECT retry_at_ms, backoff_steps, failures FROM sources") == [
        (clock.ms + 60_000, 1, 2)  # a backoff, no failure added
    ]
    assert q.claim(led.db, "w", 1000) is None
    clock.advance(60_000)
    reprobe = _item(led, handler)
    assert _roles(reprobe) == [("alpha/small", "primary", "invalid_output")]
    assert reprobe.outcome is ItemOutcome.PAUSED  # the 3rd output failure


# --------------------------------------------------------------------------- item 9


def test_issue12_item9_settle_kind_cancelled_goes_through_the_cancelled_branch(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(defaultModel="alpha/small")
    r = led.reserve("s", "alpha/small")
    led.close()
    from ledger.cli.main import cli
    result = CliRunner().invoke(
        cli, ["--home", str(led.state.path), "settle", str(r.id), "--kind", "cancelled"]
    )
    assert result.exit_code == 0, result.output
    assert db_rows(led.state.path, "SELECT status, kind FROM reservations") == [
        ("cancelled", "cancelled")
    ]
    assert db_rows(led.state.path, "SELECT failures, retry_at_ms FROM sources") == [(0, None)]


def test_r_res_3_a_source_paused_before_the_follow_up_ends_its_item_paused(
    make_ledger: LedgerFactory,
) -> None:
    """A failed first attempt permits a correction; the source is paused before it is reserved:
    the follow-up is refused `source_paused` and the item (and the summary) say `paused`."""
    led = make_ledger(defaultModel="alpha/small")
    led.add_source("s", None)
    calls: list[AttemptRole] = []

    def handler(job: Job) -> HandlerResult:
        calls.append(job.role)
        led.set_source_state("s", "pause")  # an operator's `ledger source pause` meanwhile
        return HandlerResult.failure(FailureKind.INVALID_OUTPUT, "json_contract")

    summary = drain(led, handler, worker_id="w")
    assert calls == [AttemptRole.PRIMARY]  # the correction was refused, never called
    assert (summary.items, summary.paused, summary.failed) == (1, 1, 0)
    assert _state(led) == ("paused", None)


# --------------------------------------------------------------------------- issue 20 item 1


def _always_failing_commit(clock: Clock, calls: list[str]) -> Handler:
    """A good provider call whose commit always raises (the handler's own store is down)."""

    def handler(job: Job) -> HandlerResult:
        calls.append(job.source_id)
        clock.advance(5)

        def commit() -> None:
            raise OSError("the handler's own store is full")

        return HandlerResult.success(commit=commit)

    return handler


def _source_row(led: Ledger, source: str = "s") -> tuple[Any, ...]:
    return stored(
        led.state.db_url,
        "SELECT state, failures, backoff_steps, retry_at_ms, pause_reason FROM sources "
        "WHERE id = :id",
        id=source,
    )[0]


def test_issue20_item1_r_pol_3_a_failing_commit_backs_off_and_costs_one_call_per_drain(
    make_ledger: LedgerFactory, clock: Clock, home: Path
) -> None:
    led = make_ledger(defaultModel="alpha/small", sourceCalls=10)
    led.add_source("s", "payload")
    calls: list[str] = []
    summary = drain(led, _always_failing_commit(clock, calls), worker_id="w")
    assert calls == ["s"]  # one provider call, never rerun back to back
    assert (summary.items, summary.commit_failed, summary.attempts) == (1, 1, 1)
    now = q.ledger_now(led.db)
    state, failures, steps, retry_at, paused = _source_row(led)
    assert (state, failures, steps, paused) == ("queued", 1, 1, None)
    assert retry_at == now + 60_000  # R-POL-3: the first backoff, 1 min (jitter 0 here)
    # nothing due: another drain makes no call until the backoff ends
    assert drain(led, _always_failing_commit(clock, calls), worker_id="w").items == 0
    assert calls == ["s"]
    # status and source show say so
    doc = json.loads(CliRunner().invoke(_cli(), ["--home", str(home), "status", "--json"]).output)
    listed = {s["id"]: s for s in doc["sources"]["list"]}
    assert listed["s"]["failures"] == 1
    assert listed["s"]["retry_at"] is not None
    assert any(
        n["source"] == "s" and "commit failed" in n["message"] for n in doc["notices"]
    ), doc["notices"]
    text = CliRunner().invoke(_cli(), ["--home", str(home), "status"]).output
    assert "commit failed" in text
    shown = json.loads(
        CliRunner().invoke(_cli(), ["--home", str(home), "source", "show", "s", "--json"]).output
    )
    assert (shown["failures"], shown["backoff_steps"]) == (1, 1)
    assert shown["retry_at"] is not None


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_issue20_item1_r_pol_5_failing_commits_reach_the_failure_cap(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(defaultModel="alpha/small", sourceCalls=10)
    led.add_source("s", "payload")
    calls: list[str] = []
    outcomes = []
    for backoff_ms in (60_000, 300_000, 900_000, 3_600_000, 3_600_000):
        summary = drain(led, _always_failing_commit(clock, calls), worker_id="w")
        outcomes.append((summary.commit_failed, summary.paused))
        retry_at = _source_row(led)[3]
        if len(outcomes) < 5:
            assert retry_at == q.ledger_now(led.db) + backoff_ms  # 1, 5, 15 min, then 1 h
        clock.advance(backoff_ms + 1)
    assert len(calls) == 5  # one call per backoff period
    assert outcomes == [(1, 0)] * 4 + [(0, 1)]  # the 5th failure pauses the source
    state, failures, _, _, paused = _source_row(led)
    assert (state, failures, paused) == ("paused", 5, "failure_cap")
    assert drain(led, _always_failing_commit(clock, calls), worker_id="w").items == 0
    assert len(calls) == 5


def test_issue20_item1_a_failing_commit_in_a_worker_process_makes_one_provider_call(
    tmp_path: Path,
) -> None:
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        home = standin_home(tmp_path / "home", standin, sourceCalls=4)
        led = open_ledger(home)
        led.add_source("s", "payload")
        led.close()
        proc = subprocess.run(
            worker_argv(home, "--once", "--json", "--handler",
                        "tests.support.procs:failing_commit_handler"),
            cwd=ROOT, env=cli_env(), capture_output=True, timeout=120, check=False,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["commit_failed"] == 1
    assert len(standin.requests) == 1  # was 4 (every source call) before issue 20 item 1
    assert db_rows(home, "SELECT state, failures, backoff_steps FROM sources") == [
        ("queued", 1, 1)
    ]


def _cli() -> Any:
    from ledger.cli.main import cli

    return cli


# --------------------------------------------------------------------------- issue 20 item 2


@pytest.mark.parametrize("lease_ms", [10, 40, 1000])
def test_issue20_item2_r_q_2_four_worker_processes_commit_a_slow_commit_once(
    tmp_path: Path, lease_ms: int
) -> None:
    """Four `worker run --loop` processes, one source whose commit takes 3 s (3 leases at the
    floor): the heartbeat keeps the lease, so it is called and committed once. A lease shorter
    than the heartbeat can keep is refused before any work (before issue 20: 3 calls and 3
    commits at 10 ms here, 4 at 40 ms in the issue's run)."""
    reply = '{"ok": true}'
    log = tmp_path / "commits.log"
    with StandIn(default=Scripted(text=reply)) as standin:
        home = standin_home(tmp_path / "home", standin, leaseMs=1000, timeoutMs=10_000)
        led = open_ledger(home)
        led.add_source("s", "payload")
        led.close()
        policy = json.loads((home / "recovery.json").read_text())
        (home / "recovery.json").write_text(json.dumps({**policy, "leaseMs": lease_ms}))
        env = cli_env(LEDGER_TEST_LOG=str(log))
        workers = [
            subprocess.Popen(
                worker_argv(home, "--loop", "--handler", "tests.support.procs:slow_commit_handler",
                            "--worker-id", f"w{i}"),
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
            for i in range(4)
        ]
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(w.poll() is None for w in workers):
                if db_rows(home, "SELECT state FROM sources") == [("done",)]:
                    time.sleep(1.5)  # past another lease: any rival would have claimed by now
                    break
                time.sleep(0.1)
            for w in workers:
                if w.poll() is None:
                    w.terminate()
            errors = [w.communicate(timeout=60)[1].decode() for w in workers]
            results = [(w.returncode, err) for w, err in zip(workers, errors, strict=True)]
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.communicate()
    if lease_ms < 1000:
        assert [code for code, _ in results] == [2] * 4
        assert all("leaseMs: must be at least 1000" in err for _, err in results)
        assert not log.exists()
        assert standin.requests == []
        return
    assert [code for code, _ in results] == [0] * 4, results
    assert log.read_text().split("\n") == ["start s", "s", ""]  # committed once
    assert len(standin.requests) == 1
    assert db_rows(home, "SELECT state, lease_owner FROM sources") == [("done", None)]
