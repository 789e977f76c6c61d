"""R-POL-4, R-POL-6, R-Q-3, R-Q-4, R-RES-11: one queue item and `ledger worker run`, over real HTTP
against the local stand-in."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.api import Ledger
from ledger.classify import classify_kind
from ledger.kinds import AttemptRole, CooldownScope, FailureKind
from ledger.providers.base import Message
from ledger.records import Cancelled, Failed
from ledger.standin.server import Scripted, StandIn
from ledger.store import queue as q
from ledger.worker.drain import drain
from ledger.worker.handler import Job, echo_handler, load_handler
from ledger.worker.item import run_item
from ledger.worker.queue import HandlerResult, ItemOutcome, classify_result
from tests.support.queue_setup import (
    ROOT,
    cli_env,
    db_rows,
    one_item,
    open_ledger,
    roles,
    standin_home,
    worker_argv,
)


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn(default=Scripted(text='{"ok": true}')) as server:
        yield server


@pytest.fixture
def led(tmp_path: Path, standin: StandIn) -> Iterator[Ledger]:
    ledger = open_ledger(standin_home(tmp_path / "home", standin))
    yield ledger
    ledger.close()


# --------------------------------------------------------------------------- R-POL-4


def test_r_pol_4_at_most_two_immediate_attempts(tmp_path: Path, standin: StandIn) -> None:
    led = open_ledger(standin_home(tmp_path / "h3", standin, sourceModels=3))
    standin.set_script("m1", [Scripted(status=401)])
    standin.set_script("m2", [Scripted(status=401)])
    report = one_item(led, "s")
    # p3/m3 would still be eligible: only the two-attempt cap stops the item
    assert roles(report) == [("p1/m1", "primary", "auth"), ("p2/m2", "fallback", "auth")]
    assert report.outcome is ItemOutcome.FAILED
    assert [r.model for r in standin.requests] == ["m1", "m2"]
    assert [r.path for r in standin.requests] == ["/v1/chat/completions", "/v1/messages"]
    assert db_rows(led.state.path, "SELECT count(*) FROM reservations") == [(2,)]
    assert db_rows(led.state.path, "SELECT fallback_from FROM reservations WHERE id = 2") == [
        ("p1/m1",)
    ]
    assert led.select("s").routes == ("p3/m3",)
    assert db_rows(led.state.path, "SELECT state, lease_owner FROM sources") == [("queued", None)]
    led.close()


def test_r_pol_4_fallback_success_finishes_the_source(led: Ledger, standin: StandIn) -> None:
    standin.set_script("m1", [Scripted(status=429, retry_after="90")])
    report = one_item(led, "s")
    assert roles(report) == [("p1/m1", "primary", "rate_limit"), ("p2/m2", "fallback", None)]
    assert report.outcome is ItemOutcome.DONE
    assert db_rows(led.state.path, "SELECT state FROM sources") == [("done",)]


def test_r_pol_4_no_fallback_when_the_failure_does_not_permit_it(
    led: Ledger, standin: StandIn
) -> None:
    standin.set_script("m1", [Scripted(status=503)])  # first transport failure: backoff only
    report = one_item(led, "s")
    assert roles(report) == [("p1/m1", "primary", "transport")]
    assert report.outcome is ItemOutcome.FAILED


def test_r_pol_4_invalid_output_gets_the_correction_on_the_same_model_naming_the_rule(
    led: Ledger,
) -> None:
    seen: list[tuple[str, AttemptRole, str | None]] = []

    def contract_handler(job: Job) -> HandlerResult:
        seen.append((job.route, job.role, job.correction_reason))
        response = job.call([Message("user", "reply with the contract")])
        if job.correction_reason is None:
            return HandlerResult.failure(FailureKind.INVALID_OUTPUT, "json_contract",
                                         response=response)
        return HandlerResult.success(response)

    report = one_item(led, "s", contract_handler)
    assert seen == [
        ("p1/m1", AttemptRole.PRIMARY, None),
        ("p1/m1", AttemptRole.CORRECTION, "json_contract"),
    ]
    assert report.outcome is ItemOutcome.DONE
    assert db_rows(led.state.path, "SELECT role, reason FROM reservations ORDER BY id") == [
        ("primary", "json_contract"),
        ("correction", None),
    ]


def test_r_pol_4_correction_owed_from_an_earlier_item_comes_first(led: Ledger) -> None:
    led.add_source("s", "payload")
    first = led.reserve("s", "p2/m2")
    led.settle(first.id, _failed(FailureKind.INVALID_OUTPUT, "json_contract"))
    seen: list[tuple[str, AttemptRole, str | None]] = []

    def handler(job: Job) -> HandlerResult:
        seen.append((job.route, job.role, job.correction_reason))
        return echo_handler(job)

    claim = q.claim(led.db, "w", led.policy.lease_ms)
    assert claim is not None
    report = run_item(led, claim, handler)
    assert seen == [("p2/m2", AttemptRole.CORRECTION, "json_contract")]
    assert report.outcome is ItemOutcome.DONE


def _failed(kind: FailureKind, reason: str | None = None) -> Failed:
    return Failed(classify_kind(kind, reason))


@pytest.mark.parametrize(
    ("reply", "kind", "subkind", "reason"),
    [
        (Scripted(text='{"summary": 1}'), None, None, None),
        (Scripted(text='{"summary": '), "invalid_output", "reported", "invalid_json"),
        (Scripted(text='{"a": 1}', stop_reason="length"), "invalid_output", "length_stop", None),
        (Scripted(status=429, retry_after="5"), "rate_limit", None, None),
        (Scripted(status=400, error_code="context_length_exceeded"), "request_rejected",
         "context_overflow", None),
    ],
)
def test_r_pol_4_echo_handler_validates_json_over_real_http(
    led: Ledger, standin: StandIn, reply: Scripted, kind: str | None, subkind: str | None,
    reason: str | None,
) -> None:
    standin.set_script("m1", [reply])
    model = led.model("p1/m1")
    from ledger.worker.item import _caller

    job = Job("s", "payload", "p1/m1", model, led.db.clock_fn() + 10_000, 1,
              AttemptRole.PRIMARY, None, 256, _caller(led, model, led.db.clock_fn))
    result = echo_handler(job)
    assert standin.bodies[-1]["max_tokens"] == 256
    if kind is None:
        assert result.ok
        return
    assert not result.ok
    found = classify_result(result, led.db.clock_fn())
    assert found.kind == kind
    if subkind is not None:
        assert found.subkind == subkind
    assert found.reason == reason


def test_r_res_11_a_late_success_is_never_handed_over(led: Ledger) -> None:
    committed: list[str] = []

    def slow_handler(job: Job) -> HandlerResult:
        response = job.call([Message("user", "hi")])
        while led.db.clock_fn() <= job.deadline_ms:  # the reply arrives after the deadline
            time.sleep(0.01)
            led.db.clock_fn = lambda: job.deadline_ms + 5
        return HandlerResult.success(response, commit=lambda: committed.append(job.source_id))

    report = one_item(led, "s", slow_handler)
    assert report.outcome is ItemOutcome.LATE
    assert committed == []
    assert db_rows(led.state.path, "SELECT status, late FROM reservations") == [("succeeded", 1)]
    assert db_rows(led.state.path, "SELECT state FROM sources") == [("queued",)]


def test_r_q_1_an_accepted_result_is_committed_and_finishes_the_source(led: Ledger) -> None:
    committed: list[str] = []

    def handler(job: Job) -> HandlerResult:
        result = echo_handler(job)
        return HandlerResult(ok=True, commit=lambda: committed.append(job.source_id)) \
            if result.ok else result

    assert one_item(led, "s", handler).outcome is ItemOutcome.DONE
    assert committed == ["s"]
    assert db_rows(led.state.path, "SELECT state, lease_owner FROM sources") == [("done", None)]


def test_a_raising_handler_is_classified_by_type_and_the_lease_released(led: Ledger) -> None:
    def broken(job: Job) -> HandlerResult:
        raise RuntimeError("secret provider prose must not be stored")

    report = one_item(led, "s", broken)
    assert roles(report) == [("p1/m1", "primary", "unknown")]
    rows = db_rows(led.state.path, "SELECT kind, subkind, reason FROM reservations")
    assert rows == [("unknown", "exception", None)]
    assert db_rows(led.state.path, "SELECT state, lease_owner FROM sources") == [("queued", None)]


def test_r_q_1_a_finished_item_is_not_released_again_a_failed_one_is(
    led: Ledger, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`finish` clears the lease with the source's done state: the item's release would match
    nothing and cost one more write transaction per item (issue 23); any other end releases."""
    released: list[str] = []
    real = led.release

    def release(source: str, worker_id: str) -> bool:
        released.append(source)
        return real(source, worker_id)

    monkeypatch.setattr(led, "release", release)
    assert one_item(led, "ok").outcome is ItemOutcome.DONE
    assert released == []
    assert db_rows(led.state.path, "SELECT state, lease_owner FROM sources") == [("done", None)]
    standin.set_script("m1", [Scripted(status=400)])
    standin.set_script("m2", [Scripted(status=400)])
    assert one_item(led, "bad").outcome is not ItemOutcome.DONE
    assert released == ["bad"]
    assert db_rows(
        led.state.path, "SELECT state, lease_owner FROM sources WHERE id = 'bad'"
    ) == [("queued", None)]


# --------------------------------------------------------------------------- R-POL-6


def test_r_pol_6_unroutable_source_goes_behind_other_work(led: Ledger) -> None:
    led.add_source("stuck", "payload")
    for model in ("p1/m1", "p2/m2"):  # the source's two allowed models (sourceModels = 2)
        led.settle(led.reserve("stuck", model).id, Cancelled())
    for provider in ("p1", "p2"):
        led.store.set_cooldown(CooldownScope.PROVIDER, provider, 3_600_000, None)
    led.add_source("fresh-1", "payload")  # newer, but p3/m3 is open to them
    led.add_source("fresh-2", "payload")
    order: list[tuple[str, ItemOutcome]] = []
    summary = drain(led, echo_handler, worker_id="w", max_items=1,
                    on_item=lambda item, _s: order.append((item.source_id, item.outcome)))
    assert order == [("stuck", ItemOutcome.UNROUTABLE)]
    assert summary.exit_code() == 3  # nothing due could be worked
    rows = db_rows(led.state.path, "SELECT retry_at_ms, state FROM sources WHERE id = 'stuck'")
    assert rows == [(None, "queued")]  # its own retry time is unchanged
    claimed = []
    while (claim := q.claim(led.db, "w", 60_000)) is not None:
        claimed.append(claim.source_id)
    assert claimed == ["fresh-1", "fresh-2", "stuck"]


# --------------------------------------------------------------------------- R-Q-3


def test_r_q_3_exit_code_3_when_everything_due_is_refused_by_budget(
    tmp_path: Path, standin: StandIn
) -> None:
    home = standin_home(tmp_path / "home", standin, callsPerHour=1)
    led = open_ledger(home)
    led.reserve("other", "p1/m1")  # the only hourly slot is taken
    led.add_source("s1", "payload")
    led.add_source("s2", "payload")
    led.close()
    from ledger.cli.main import cli
    result = CliRunner().invoke(cli, ["--home", str(home), "worker", "run", "--once", "--json"])
    assert result.exit_code == 3, result.output
    doc = json.loads(result.output)
    assert doc["refusals"] == {"shared_hourly_budget": 1}  # the pass stops at a global refusal
    assert standin.requests == []
    ok = CliRunner().invoke(cli, ["--home", str(home), "worker", "run", "--once", "--json",
                                  "--max-items", "1"])
    assert ok.exit_code == 3


def test_r_q_3_exit_code_0_when_nothing_is_due(tmp_path: Path, standin: StandIn) -> None:
    home = standin_home(tmp_path / "home", standin)
    from ledger.cli.main import cli
    result = CliRunner().invoke(cli, ["--home", str(home), "worker", "run", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["items"] == 0


def test_r_q_3_bad_handler_spec_is_usage_error(tmp_path: Path, standin: StandIn) -> None:
    home = standin_home(tmp_path / "home", standin)
    from ledger.cli.main import cli
    for spec in ("nocolon", "no.such.module:f", "ledger.worker:NOPE"):
        result = CliRunner().invoke(cli, ["--home", str(home), "worker", "run", "--handler", spec])
        assert result.exit_code == 2, spec
    assert load_handler("ledger.worker:echo_handler") is echo_handler


def test_r_q_3_max_items_and_once_drain(led: Ledger) -> None:
    for n in range(5):
        led.add_source(f"s{n}", "payload")
    assert drain(led, echo_handler, max_items=2).items == 2
    rest = drain(led, echo_handler)
    assert rest.items == 3
    assert rest.done == 3
    assert rest.exit_code() == 0


# --------------------------------------------------------------------------- R-Q-4


@pytest.mark.parametrize("mode", ["--once", "--loop"])
def test_r_q_4_sigterm_settles_the_call_cancelled_and_releases_the_lease(
    tmp_path: Path, mode: str
) -> None:
    with StandIn({"m1": [Scripted(delay_s=60)]}) as standin:
        home = standin_home(tmp_path / "home", standin, timeoutMs=60_000)
        led = open_ledger(home)
        led.add_source("s", "payload")
        led.close()
        proc = subprocess.Popen(worker_argv(home, mode, "--json"), cwd=ROOT, env=cli_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not standin.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        assert standin.requests
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - sent
    assert proc.returncode == 0, err.decode()
    assert took < 10
    doc = json.loads(out)
    assert doc["cancelled"] == 1
    assert doc["stopped_by_signal"] is True
    assert db_rows(home, "SELECT status, kind FROM reservations") == [("cancelled", "cancelled")]
    assert db_rows(home, "SELECT state, lease_owner, failures FROM sources") == [
        ("queued", None, 0)
    ]


# --------------------------------------------------------------------------- R-CAT-3


def test_r_cat_3_a_listed_model_with_a_credential_still_answers_401_and_the_table_reacts(
    led: Ledger, standin: StandIn
) -> None:
    """Being in the catalog with its credential variable set proves nothing: the selector
    offers the model, the provider's real 401 over HTTP cools its provider (the `auth` row),
    and only then does selection exclude it, with the cooldown as the reason."""
    first = led.select("s")
    assert first.routes[0] == "p1/m1"
    assert "p1/m1" not in {e.model for e in first.excluded}
    standin.set_script("m1", [Scripted(status=401)])
    report = one_item(led, "s")
    assert roles(report)[0] == ("p1/m1", "primary", "auth")
    assert standin.requests[0].model == "m1"  # the call was really made
    after = led.select("s")
    assert "p1/m1" not in after.routes
    reasons = {e.model: e.reason for e in after.excluded}
    assert reasons["p1/m1"] == "provider_cooldown"
    cooling = db_rows(led.state.path, "SELECT scope, target FROM cooldowns")
    assert (CooldownScope.PROVIDER.value, "p1") in cooling
