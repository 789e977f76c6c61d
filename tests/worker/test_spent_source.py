"""A source that used its own `sourceCalls` or `sourceTimeMs` leaves the queue paused with that
reason (R-RES-6, R-RES-8 with R-Q-2 and R-POL-5's pause): its counters only grow, so before this
every drain pass claimed it, met the same refusal, released it and exited 3 ("everything due was
refused by budget") for ever, costing a claim and a release per spent source per pass.

Both backends for the library; a real `ledger worker run` process directly and through a real
`ledger serve` for the exit code and the service route.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ledger.api import Ledger
from ledger.records import Success
from ledger.standin.server import Scripted, StandIn
from ledger.store import queue as q
from ledger.worker.drain import drain
from ledger.worker.handler import Job
from ledger.worker.queue import HandlerResult
from tests.support.backends import BACKENDS
from tests.support.backends import rows as stored
from tests.support.ledgers import Clock, LedgerFactory
from tests.support.queue_setup import ROOT, cli_env, db_rows, open_ledger, standin_home, worker_argv
from tests.support.serving import running


def _never_called(calls: list[str]) -> object:
    def handler(job: Job) -> HandlerResult:
        calls.append(job.source_id)
        return HandlerResult.success()

    return handler


def _spend_calls(led: Ledger, source: str, n: int) -> None:
    """`n` good calls made outside the queue (a CLI caller), the source not finished."""
    for _ in range(n):
        r = led.reserve(source, "alpha/small")
        led.settle(r.id, Success(10, 10))


def _row(led: Ledger, source: str = "s") -> tuple[object, ...]:
    return tuple(
        stored(
            led.state.db_url,
            "SELECT state, pause_reason, lease_owner, "
            "(SELECT count(*) FROM reservations r WHERE r.source_id = sources.id) "
            "FROM sources WHERE id = :id",
            id=source,
        )[0]
    )


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_res_6_a_source_that_used_its_source_calls_is_paused_not_claimed_forever(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(defaultModel="alpha/small", sourceCalls=2)
    led.add_source("s", "payload")
    led.add_source("fresh", "payload")
    _spend_calls(led, "s", 2)
    calls: list[str] = []
    summary = drain(led, _never_called(calls), worker_id="w")  # type: ignore[arg-type]
    assert calls == ["fresh"]  # the spent source made no call; the other one was served
    assert (summary.items, summary.paused, summary.refused) == (2, 1, 0)
    assert summary.refusals == {"source_calls": 1}
    assert _row(led) == ("paused", "source_calls", None, 2)  # lease cleared, counters kept
    notices = stored(led.state.db_url, "SELECT category, message, source_id FROM notices")
    assert ("pause", "source paused: source_calls", "s") in [tuple(n) for n in notices]
    # the next pass has nothing due: the spent source is no longer claimed
    again = drain(led, _never_called(calls), worker_id="w")  # type: ignore[arg-type]
    assert again.items == 0
    assert again.exit_code() == 0


def test_r_res_6_resume_without_a_higher_cap_pauses_again_with_one_cap_it_runs(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(defaultModel="alpha/small", sourceCalls=2)
    led.add_source("s", "payload")
    _spend_calls(led, "s", 2)
    calls: list[str] = []
    assert drain(led, _never_called(calls), worker_id="w").paused == 1  # type: ignore[arg-type]
    led.set_source_state("s", "resume")  # counters kept (R-RES-3): still spent
    assert drain(led, _never_called(calls), worker_id="w").paused == 1  # type: ignore[arg-type]
    assert calls == []
    raised = make_ledger(defaultModel="alpha/small", sourceCalls=3)  # the operator raised it
    raised.set_source_state("s", "resume")
    summary = drain(raised, _never_called(calls), worker_id="w")  # type: ignore[arg-type]
    assert (summary.done, calls) == (1, ["s"])


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_res_8_a_source_that_used_its_source_time_is_paused(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(defaultModel="alpha/small", sourceTimeMs=10_000, timeoutMs=10_000)
    led.add_source("s", "payload")
    r = led.reserve("s", "alpha/small")
    clock.advance(10_000)  # the call took the source's whole time
    led.settle(r.id, Success(10, 10), overran=True)
    calls: list[str] = []
    summary = drain(led, _never_called(calls), worker_id="w")  # type: ignore[arg-type]
    assert (calls, summary.paused, summary.refusals) == ([], 1, {"source_time": 1})
    assert _row(led)[:2] == ("paused", "source_time")


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_q_2_release_spent_releases_a_source_that_is_not_spent_and_never_a_lost_lease(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(defaultModel="alpha/small", sourceCalls=2)
    led.add_source("s", "payload")
    _spend_calls(led, "s", 1)  # one call left: not spent
    assert q.claim(led.db, "w", 60_000) is not None
    assert led.release_spent("s", "w") is None
    assert _row(led) == ("queued", None, None, 1)  # released as usual
    _spend_calls(led, "s", 1)  # now spent, but the lease went to a rival meanwhile
    assert q.claim(led.db, "w", 1_000) is not None
    clock.advance(1_001)
    assert q.claim(led.db, "rival", 60_000) is not None
    assert led.release_spent("s", "w") is None  # not ours any more: nothing changes
    assert _row(led) == ("leased", None, "rival", 2)
    assert led.release_spent("s", "rival") == "source_calls"
    assert _row(led) == ("paused", "source_calls", None, 2)


def _spent_home(tmp_path: Path, standin: StandIn) -> Path:
    home = standin_home(tmp_path / "home", standin, sourceCalls=1)
    led = open_ledger(home)
    led.add_source("s", "payload")
    r = led.reserve("s", "p1/m1")
    led.settle(r.id, Success(1, 1))
    led.close()
    return home


@pytest.mark.parametrize("through", ["library", "service"])
def test_r_q_3_a_worker_process_pauses_a_spent_source_and_exits_0_then_nothing_is_due(
    tmp_path: Path, through: str
) -> None:
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        home = _spent_home(tmp_path, standin)
        env = cli_env()

        def run(*extra: str) -> subprocess.CompletedProcess[bytes]:
            argv = worker_argv(home, "--once", "--json", *extra)
            return subprocess.run(
                argv, cwd=ROOT, env=env, capture_output=True, timeout=120, check=False
            )

        if through == "service":
            with running(home, env=env) as served:
                first, second = run("--server", str(served.socket)), run(
                    "--server", str(served.socket)
                )
        else:
            first, second = run(), run()
    assert first.returncode == 0, first.stderr.decode()  # was 3, at every pass, for ever
    report = json.loads(first.stdout)
    assert (report["items"], report["paused"], report["refusals"]) == (1, 1, {"source_calls": 1})
    assert second.returncode == 0, second.stderr.decode()
    assert json.loads(second.stdout)["items"] == 0
    assert standin.requests == []  # no provider call was made by the worker
    assert db_rows(home, "SELECT state, pause_reason FROM sources") == [("paused", "source_calls")]
