"""R-Q-1, R-Q-2: claims, leases and releases; concurrent and killed worker processes."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.api import Ledger
from ledger.classify import classify_kind
from ledger.kinds import FailureKind
from ledger.records import Failed
from ledger.standin.server import Scripted, StandIn
from ledger.store import queue as q
from ledger.worker.drain import drain
from ledger.worker.handler import echo_handler
from tests.support.ledgers import Clock, LedgerFactory
from tests.support.queue_setup import (
    ROOT,
    assert_each_source_once,
    cli_env,
    db_rows,
    open_ledger,
    queued_home,
    standin_home,
    two_workers,
    worker_argv,
)

LEASE = 360_000


# --------------------------------------------------------------------------- shared helpers


# --------------------------------------------------------------------------- claims (in-process)


def test_r_q_2_claim_takes_oldest_last_checked_first_tie_by_id(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    led.add_source("c", "ref-c")
    led.add_source("b", "ref-b")
    clock.advance(10)
    led.add_source("a", "ref-a")
    order = []
    while (claim := q.claim(led.db, "w1", LEASE)) is not None:
        order.append(claim.source_id)
        assert claim.worker_id == "w1"
        assert claim.lease_expires_ms == clock.ms + LEASE
    assert order == ["b", "c", "a"]


def test_r_q_2_claim_reads_only_queued_and_leased_sources_through_the_claim_index(
    make_ledger: LedgerFactory,
) -> None:
    """Finished sources (a busy day leaves thousands) are never scanned by a claim (issue 23)."""
    led = make_ledger()
    plans = []
    with led.db.read() as conn:
        for stmt in (
            q._NEXT_DUE.params(now=1),
            q._NEXT_DUE_UNCHECKED.params(now=1, checked_before=1),
            q._HAS_WORK,
        ):
            sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
            plans.append([str(r[3]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")])
    for plan in plans:
        assert any("ix_sources_claim (in_queue=? AND state=?)" in p for p in plan), plan
        assert not any(p.startswith("SCAN sources") for p in plan), plan


def test_r_sim_1_has_work_sees_queued_and_leased_sources_only(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger()
    assert not q.has_work(led.db)
    led.add_source("a", "ref-a")
    assert q.has_work(led.db)  # queued
    claim = q.claim(led.db, "w1", LEASE)
    assert claim is not None
    assert q.has_work(led.db)  # leased
    assert q.finish(led.db, "a", "w1")
    assert not q.has_work(led.db)  # done
    led.add_source("b", "ref-b")
    led.set_source_state("b", "pause")
    assert not q.has_work(led.db)  # paused: no worker takes it


def test_r_q_2_release_moves_behind_and_only_owner_may_release(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    led.add_source("a", None)
    led.add_source("b", None)
    first = q.claim(led.db, "w1", LEASE)
    assert first is not None
    assert first.source_id == "a"
    assert not q.release(led.db, "a", "w2")  # not the owner
    clock.advance(5)
    assert q.release(led.db, "a", "w1")
    assert not q.release(led.db, "a", "w1")  # no longer leased
    second = q.claim(led.db, "w1", LEASE)
    assert second is not None
    assert second.source_id == "b"  # a was looked at more recently


def test_r_q_1_only_the_lease_holder_finishes_a_source(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    led.add_source("a", None)
    assert q.claim(led.db, "w1", LEASE) is not None
    clock.advance(LEASE + 1)
    assert q.claim(led.db, "w2", LEASE) is not None  # w1's lease expired and was taken
    assert not q.finish(led.db, "a", "w1")  # check and write in one transaction
    state = "SELECT state, lease_owner FROM sources WHERE id = 'a'"
    assert db_rows(led.state.path, state) == [("leased", "w2")]
    assert q.finish(led.db, "a", "w2")
    assert db_rows(led.state.path, state) == [("done", None)]
    assert not q.finish(led.db, "a", "w2")  # finished once


def test_r_q_2_backoff_and_not_queued_sources_are_not_due(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    led.add_source("backoff", None)
    led.add_source("idle", None, enqueue=False)
    led.add_source("paused", None)
    led.set_source_state("paused", "pause")
    led.add_source("done", None)
    led.set_source_state("done", "done")
    r = led.reserve("backoff", "alpha/small")
    led.settle(r.id, Failed(classify_kind(FailureKind.TRANSPORT)))  # backoff 1 min (jitter 0)
    assert q.claim(led.db, "w", LEASE) is None
    assert q.queue_times(led.db).next_retry_ms == clock.ms + 60_000
    clock.advance(59_999)
    assert q.claim(led.db, "w", LEASE) is None
    clock.advance(1)
    claim = q.claim(led.db, "w", LEASE)
    assert claim is not None
    assert claim.source_id == "backoff"


def test_r_q_2_lease_expiry_makes_a_source_claimable_by_another_worker(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    led.add_source("s", None)
    assert q.claim(led.db, "w1", 1000) is not None
    assert q.claim(led.db, "w2", 1000) is None  # two workers never hold one source
    clock.advance(999)
    assert q.claim(led.db, "w2", 1000) is None
    assert q.renew(led.db, "s", "w1", 1000)  # the owner may extend its lease
    clock.advance(999)
    assert q.claim(led.db, "w2", 1000) is None
    clock.advance(1)
    taken = q.claim(led.db, "w2", 1000)
    assert taken is not None
    assert taken.worker_id == "w2"
    assert not q.renew(led.db, "s", "w1", 1000)  # w1 lost it
    assert not q.release(led.db, "s", "w1")
    assert q.release(led.db, "s", "w2")


def test_r_q_2_checked_before_limits_a_pass_to_sources_not_seen_since(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    led.add_source("a", None)
    start = q.ledger_now(led.db)
    clock.advance(1)
    claim = q.claim(led.db, "w", LEASE, checked_before=start)
    assert claim is not None
    q.release(led.db, "a", "w")
    assert q.claim(led.db, "w", LEASE, checked_before=start) is None
    assert q.claim(led.db, "w", LEASE) is not None


def test_r_q_1_persisted_correction_survives_cancellation(make_ledger: LedgerFactory) -> None:
    from ledger.records import Cancelled

    led = make_ledger()
    led.add_source("s", "ref")
    r = led.reserve("s", "alpha/small")
    settled = led.settle(r.id, Failed(classify_kind(FailureKind.INVALID_OUTPUT, "json_contract")))
    assert settled.use_correction
    claim = q.claim(led.db, "w", LEASE)
    assert claim is not None
    assert claim.correction == q.PendingCorrection("alpha/small", "json_contract")
    corr = led.reserve("s", "alpha/small")
    led.settle(corr.id, Cancelled())  # cancelled: the allowance is still owed
    q.release(led.db, "s", "w")
    again = q.claim(led.db, "w", LEASE)
    assert again is not None
    assert again.correction == q.PendingCorrection("alpha/small", "json_contract")


@settings(max_examples=10, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8).map(sorted),
    st.data(),
)
def test_r_q_2_claim_order_is_sorted_by_last_checked_property(
    tmp_path_factory: pytest.TempPathFactory, offsets: list[int], data: st.DataObject
) -> None:
    from ledger.catalog import Catalog
    from tests.support.ledgers import TEST_CATALOG

    names = data.draw(st.permutations([f"s{i:02d}" for i in range(len(offsets))]))
    clock = Clock()
    home = tmp_path_factory.mktemp("prop")
    led = Ledger.open(home, catalog=Catalog.model_validate(TEST_CATALOG), env={}, clock=clock)
    try:
        base = clock.ms
        for name, offset in zip(names, offsets, strict=True):
            clock.ms = base + offset  # ledger time never moves backwards, so offsets ascend
            led.add_source(name, None)
        clock.ms = base + 100
        got = []
        while (claim := q.claim(led.db, "w", LEASE)) is not None:
            got.append(claim.source_id)
        assert got == [n for _, n in sorted(zip(offsets, names, strict=True))]
    finally:
        led.close()


# --------------------------------------------------------------------------- real processes


def test_r_q_2_two_concurrent_worker_processes_never_process_one_source_twice(
    tmp_path: Path,
) -> None:
    log = tmp_path / "accepted.log"
    with StandIn(default=Scripted(text='{"ok": true}', delay_s=0.03)) as standin:
        home = queued_home(tmp_path / "home", standin, 20)
        argv = worker_argv(home, "--once", "--handler",
                           "tests.support.queue_setup:appending_handler",
                           "--json")
        summaries = two_workers(argv, cli_env(LEDGER_TEST_LOG=str(log)))
    assert_each_source_once(home, log, standin, summaries, 20)


def test_r_q_2_killed_worker_loses_its_lease_at_expiry_and_nothing_committed_is_lost(
    tmp_path: Path,
) -> None:
    lease_ms = 3000
    with StandIn({"m1": [Scripted(delay_s=60)]}) as standin:
        home = standin_home(tmp_path / "home", standin, leaseMs=lease_ms, timeoutMs=2500)
        led = open_ledger(home)
        led.add_source("victim", "payload")
        proc = subprocess.Popen(
            worker_argv(home, "--once", "--worker-id", "doomed"), cwd=ROOT, env=cli_env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not standin.requests and time.monotonic() < deadline:
                time.sleep(0.02)
            assert standin.requests, "the worker never called the stand-in"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        killed_at = time.monotonic()
        committed = db_rows(home, "SELECT id, source_id, status FROM reservations")
        assert committed == [(1, "victim", "open")]
        assert db_rows(home, "SELECT state, lease_owner FROM sources") == [("leased", "doomed")]
        assert q.claim(led.db, "rescuer", lease_ms) is None  # still leased
        while time.monotonic() - killed_at < lease_ms / 1000 + 0.5:
            time.sleep(0.1)
        summary = drain(led, echo_handler, worker_id="rescuer")
        led.close()
    assert summary.done == 1
    rows = db_rows(home, "SELECT id, status FROM reservations ORDER BY id")
    assert rows[0][0] == 1  # the killed worker's reservation is still there, counted once
    assert rows[0][1] in {"open", "expired"}
    assert rows[1] == (2, "succeeded")
    assert db_rows(home, "PRAGMA integrity_check") == [("ok",)]
    assert db_rows(home, "SELECT state, lease_owner FROM sources") == [("done", None)]
