"""R-POL-9, R-POL-10, R-RES-5, R-SEL-7 (issue 24 item 1): one recovery probe per target, escalation.

Store behaviour runs on SQLite and PostgreSQL with a frozen clock; the herd and the killed probe
use real processes.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.classify import classify_http
from ledger.clock import now_ms
from ledger.errors import Refused
from ledger.records import Cancelled, Failed, Success
from ledger.store.views import cooldown_list
from tests.support.backends import BACKENDS
from tests.support.ledgers import TEST_CATALOG, Clock, LedgerFactory
from tests.support.procs import probe_racer, write_home

pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)

MIN = 60_000


def cooling_until(led: Ledger, target: str) -> int | None:
    _, rows = cooldown_list(led.db)
    ends = [c.until_ms for c in rows if c.target == target]
    return max(ends) if ends else None


def fail(led: Ledger, sid: str, model: str, status: int, clock: Clock, **headers: str) -> Any:
    res = led.reserve(sid, model)
    return led.settle(res.id, Failed(classify_http(status, headers, None, clock.ms)))


def refusal(led: Ledger, sid: str, model: str) -> str:
    with pytest.raises(Refused) as info:
        led.reserve(sid, model)
    return info.value.reason


def test_r_pol_10_transport_escalation_1_2_4_8_15_15_then_success_resets(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    fail(led, "s0", "alpha/small", 503, clock)
    fail(led, "s1", "alpha/small", 503, clock)
    assert cooling_until(led, "alpha/small") == clock.ms + 1 * MIN  # the second strike: 1 min
    seen = []
    for n in range(6):
        clock.ms = cooling_until(led, "alpha/small") or clock.ms
        probe = led.reserve(f"p{n}", "alpha/small")  # the cooldown ended: this is the probe
        assert refusal(led, f"q{n}", "alpha/small") == "probing"  # everyone else waits
        led.reserve(f"q{n}", "alpha/big")  # another model of the same provider is not held
        clock.advance(1000)
        led.settle(probe.id, Failed(classify_http(503, {}, None, clock.ms)))
        seen.append(((cooling_until(led, "alpha/small") or 0) - clock.ms) // MIN)
    assert seen == [2, 4, 8, 15, 15, 15]
    clock.ms = cooling_until(led, "alpha/small") or clock.ms
    probe = led.reserve("ok", "alpha/small")
    result = led.settle(probe.id, Success(input_tokens=1, output_tokens=1))
    assert any("recovery probe succeeded" in a for a in result.actions)
    led.reserve("free-1", "alpha/small")  # probing ended: no probe any more, no refusal
    led.reserve("free-2", "alpha/small")
    # the streak was reset: the next cooldown starts again at the base
    fail(led, "t0", "alpha/small", 503, clock)
    fail(led, "t1", "alpha/small", 503, clock)
    assert cooling_until(led, "alpha/small") == clock.ms + 1 * MIN


def test_r_pol_10_auth_doubles_up_to_4x_and_never_below_a_hint(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    fail(led, "s0", "alpha/small", 401, clock)
    seen = []
    for n in range(3):
        clock.ms = cooling_until(led, "alpha") or clock.ms
        assert fail(led, f"p{n}", "alpha/big", 401, clock).kind == "auth"
        seen.append(((cooling_until(led, "alpha") or 0) - clock.ms) // MIN)
    assert seen == [30, 60, 60]  # 15 min -> 30 min -> 1 h, capped at 4 x the base
    # rate_limit on a model: a failed probe doubles 60 s, but a longer Retry-After wins
    fail(led, "r0", "beta/mid", 429, clock)
    clock.ms = cooling_until(led, "beta/mid") or clock.ms
    fail(led, "r1", "beta/mid", 429, clock, **{"retry-after": "600"})
    assert cooling_until(led, "beta/mid") == clock.ms + 10 * MIN


def test_r_pol_9_cancelled_probe_frees_the_slot_and_answered_probe_ends_probing(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    fail(led, "s0", "beta/mid", 429, clock)
    clock.advance(MIN)
    probe = led.reserve("p0", "beta/mid")
    assert refusal(led, "p1", "beta/mid") == "probing"
    led.settle(probe.id, Cancelled())  # the probe said nothing about the target
    probe = led.reserve("p1", "beta/mid")  # the next reservation is the probe
    assert refusal(led, "p2", "beta/mid") == "probing"
    # the provider answered (bad output is not provider health): probing ends
    led.settle(probe.id, Failed(_invalid()))
    led.reserve("p2", "beta/mid")
    led.reserve("p3", "beta/mid")


def _invalid() -> Any:
    from ledger.classify import classify_kind

    return classify_kind("invalid_output", "json_contract")


def test_r_pol_9_probe_past_its_deadline_frees_the_target(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(timeoutMs=30_000)
    fail(led, "s0", "beta/mid", 429, clock)
    clock.advance(MIN)
    probe = led.reserve("p0", "beta/mid")
    clock.ms = probe.deadline_ms - 1
    assert refusal(led, "p1", "beta/mid") == "probing"
    clock.ms = probe.deadline_ms
    second = led.reserve("p1", "beta/mid")  # the probe's worker is gone: the next one probes
    assert refusal(led, "p2", "beta/mid") == "probing"
    led.settle(second.id, Success())
    led.reserve("p2", "beta/mid")


def test_r_pol_9_override_never_takes_the_probe_slot_and_other_failures_are_inconclusive(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    fail(led, "s0", "alpha/small", 401, clock)  # the provider alpha cools 15 min
    clock.advance(15 * MIN)
    led.add_source("o", "payload")
    led.evolve("o", "alpha/small")  # an explicit override attempt is no probe
    probe = led.reserve("p0", "alpha/big")  # the provider's probe, on any of its models
    assert refusal(led, "p1", "alpha/small") == "probing"
    # a model-level failure says nothing about the provider's account: inconclusive
    led.settle(probe.id, Failed(classify_http(429, {}, None, clock.ms)))
    again = led.reserve("p1", "alpha/small")  # the next reservation is the provider's probe
    assert refusal(led, "p2", "alpha/small") == "probing"
    led.settle(again.id, Failed(classify_http(401, {}, None, clock.ms)))
    assert cooling_until(led, "alpha") == clock.ms + 30 * MIN  # the first failed probe: doubled


def test_r_pol_9_manual_cooldowns_and_cooldown_clear_end_without_a_probe(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger()
    led.store.set_cooldown(*led.cooldown_target("gamma"), 5 * MIN, None)
    clock.advance(5 * MIN)
    led.reserve("m0", "gamma/g1")
    led.reserve("m1", "gamma/g1")  # a manual cooldown ends without a probe
    fail(led, "s0", "beta/mid", 429, clock)
    assert led.store.clear_cooldown(*led.cooldown_target("beta/mid"), True).removed == 1
    led.reserve("c0", "beta/mid")
    led.reserve("c1", "beta/mid")  # cleared by hand: no probe either


def test_r_sel_7_primary_down_backup_serves_probe_succeeds_primary_first_again(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(defaultModel="alpha/small", fallbackModels=["beta/mid"])
    fail(led, "s0", "alpha/small", 503, clock)
    fail(led, "s1", "alpha/small", 503, clock)
    down = led.select("a")
    assert down.routes == ("beta/mid",)
    assert {e.model: e.reason for e in down.excluded}["alpha/small"] == "model_cooldown"
    clock.advance(MIN)
    assert led.select("a").routes[0] == "alpha/small"  # cooled down: the primary is tried again
    probe = led.reserve("a", "alpha/small")  # the first reservation is the probe
    meanwhile = led.select("b")
    assert meanwhile.routes == ("beta/mid",)  # backups serve while the probe is in flight
    excluded = {e.model: e for e in meanwhile.excluded}["alpha/small"]
    assert excluded.reason == "probing"
    assert excluded.until_ms == probe.deadline_ms
    led.reserve("b", "beta/mid")
    led.settle(probe.id, Success())
    assert led.select("c").routes == ("alpha/small", "beta/mid")  # the primary is first again


def test_r_pol_9_a_cooldown_set_while_a_probe_is_in_flight_ends_in_a_probe_of_its_own(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    """Issue 29 item 8: calls in flight when the first 429 landed come back as late 429s; the
    cooldown each sets ends in a probe too, even when an older probe succeeds meanwhile."""
    led = make_ledger(timeoutMs=120_000)
    start = clock.ms
    r0 = led.reserve("r0", "beta/mid")  # in flight
    fail(led, "r1", "beta/mid", 429, clock)  # the model cools 60 s
    assert cooling_until(led, "beta/mid") == start + MIN
    clock.ms = start + 62_000
    r2 = led.reserve("r2", "beta/mid")  # the cooldown ended: the probe
    assert refusal(led, "x", "beta/mid") == "probing"
    clock.ms = start + 63_000
    led.settle(r0.id, Failed(classify_http(429, {}, None, clock.ms)))  # R0's late 429
    assert cooling_until(led, "beta/mid") == start + 123_000
    clock.ms = start + 64_000
    result = led.settle(r2.id, Success())  # the older probe succeeds
    assert any("recovery probe succeeded" in a for a in result.actions)
    assert refusal(led, "x", "beta/mid") == "model_cooldown"
    clock.ms = start + 124_000
    outcomes = []
    for n in range(5):
        try:
            outcomes.append(("granted", led.reserve(f"h{n}", "beta/mid").id))
        except Refused as refused:
            outcomes.append((refused.reason, 0))
    assert [kind for kind, _ in outcomes] == ["granted"] + ["probing"] * 4
    probe = outcomes[0][1]
    led.settle(probe, Success())  # this probe tests the newer cooldown: probing ends
    led.reserve("after-1", "beta/mid")
    led.reserve("after-2", "beta/mid")


def test_r_pol_9_provider_and_model_armed_at_once_are_both_claimed_by_one_probe(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    """Issue 29 item 19: when a provider's and a model's cooldowns have both ended, the one probe
    holds both; its success ends both, so no second probe follows on the model."""
    led = make_ledger()
    fail(led, "m0", "alpha/small", 429, clock)  # the model cools 1 min
    fail(led, "p0", "alpha/big", 401, clock)  # the provider cools 15 min
    clock.advance(15 * MIN)
    probe = led.reserve("probe", "alpha/small")  # both armed: this one probe holds both
    assert refusal(led, "x0", "alpha/small") == "probing"
    assert refusal(led, "x1", "alpha/big") == "probing"
    result = led.settle(probe.id, Success())
    assert sorted(a for a in result.actions if "recovery probe succeeded" in a) == [
        "recovery probe succeeded on model alpha/small",
        "recovery probe succeeded on provider alpha",
    ]
    for n in range(3):  # neither target probes again: no refusal, no second probe
        led.reserve(f"after-{n}", "alpha/small")
    led.reserve("after-big", "alpha/big")


HERD = 24


def _spawn(home: Path, db: str | None, target: Any, *args: Any) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(HERD)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(str(home), barrier, tag, out, *args), kwargs={"db": db})
        for tag in range(HERD)
    ]
    for proc in procs:
        proc.start()
    reports = [out.get(timeout=240) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return reports


def test_r_pol_9_herd_of_24_processes_at_cooldown_end_gets_exactly_one_probe(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, callsPerHour=1000)
    # a 429 settled two minutes ago cooled the model for 60 s: the cooldown has just ended
    past = Clock(now_ms() - 2 * MIN)
    led = Ledger.open(home, ledger_db, env={}, clock=past)
    res = led.reserve("s0", "alpha/small")
    led.settle(res.id, Failed(classify_http(429, {}, None, past.ms)))
    led.close()
    reports = _spawn(home, ledger_db, probe_racer)
    assert [e for r in reports for e in r["errors"]] == []
    granted: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    for report in reports:
        granted.update(report["granted"])
        refused.update(report["refused"])
    assert granted == {"alpha/small": 1, "beta/mid": HERD}  # exactly one probe, backups serve
    assert refused == {"probing": HERD - 1}


KILLED_PROBE = """
import sys, time
from ledger.api import Ledger
led = Ledger.open(sys.argv[1], sys.argv[2] or None, env={})
res = led.reserve("probe", "alpha/small")
print(res.deadline_ms, flush=True)
time.sleep(600)
"""


def test_r_pol_9_probe_whose_worker_is_killed_frees_the_target_at_its_deadline(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, callsPerHour=1000, timeoutMs=60_000)
    past = Clock(now_ms() - 2 * MIN)
    led = Ledger.open(home, ledger_db, env={}, clock=past)
    res = led.reserve("s0", "alpha/small")
    led.settle(res.id, Failed(classify_http(429, {}, None, past.ms)))
    led.close()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_PROBE, str(home), ledger_db or ""],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    deadline = int(child.stdout.readline())
    os.kill(child.pid, signal.SIGKILL)  # the probe's worker dies holding it
    child.wait(timeout=30)
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    before = Ledger.open(home, ledger_db, env={}, clock=Clock(deadline - 1000))
    with pytest.raises(Refused) as info:
        before.reserve("s1", "alpha/small")
    assert info.value.reason == "probing"
    assert info.value.retry_at_ms == deadline
    before.close()
    after = Ledger.open(home, ledger_db, env={}, clock=Clock(deadline))
    probe = after.reserve("s1", "alpha/small")  # freed at the dead probe's deadline
    after.settle(probe.id, Success())
    after.reserve("s2", "alpha/small")
    after.close()
