"""R-SIM-4 (issue 29 item 14): idle virtual time costs nothing. The simulator jumps over the polls
in which the `--loop` worker would find nothing, and the run is the one stepping through them
gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.simulate import runner
from ledger.simulate.idle import busy_poll, last_poll_until
from ledger.simulate.inputs import load_workload
from ledger.simulate.limits import DAY_MS
from ledger.simulate.simulation import simulate
from ledger.worker.drain import MAX_SLEEP_MS, MIN_SLEEP_MS
from tests.support.simulation import CATALOG

CAP, FLOOR = MAX_SLEEP_MS, MIN_SLEEP_MS


def stepped(first: int, due: int | None, arrival: int | None, end: int) -> int | None:
    """The worker's polls one by one (ledger.worker.drain._sleep_ms), up to `end`."""
    t = first
    while t <= end:
        if (due is not None and t >= due) or (arrival is not None and t >= arrival):
            return t
        t += max(FLOOR, min(CAP, due - t)) if due is not None else CAP
    return None


times = st.integers(min_value=0, max_value=40 * CAP)


@given(first=times, due=st.none() | times, arrival=st.none() | times)
def test_r_sim_4_the_jump_lands_on_the_poll_stepping_reaches(
    first: int, due: int | None, arrival: int | None
) -> None:
    end = 200 * CAP
    assert busy_poll(first, due, arrival, CAP, FLOOR) == stepped(first, due, arrival, end)


@given(first=times, end=times)
def test_r_sim_4_the_last_idle_poll_before_the_end(first: int, end: int) -> None:
    polls = range(first, end + 1, CAP)
    assert last_poll_until(first, end, CAP) == (polls[-1] if polls else None)


def _write(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "input.json"
    path.write_text(json.dumps(document))
    return path


def test_r_sim_4_skipping_idle_polls_gives_the_run_stepping_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sparse bursts, an outage with Retry-After (cooldowns, backoff) and a tight hourly budget
    (refusals every poll while it is spent): the same history, totals, refusals and end."""
    wakes: list[int] = []
    real_sleep = runner.VirtualStopper.sleep

    def counted(self: runner.VirtualStopper, seconds: float) -> None:
        wakes[-1] += 1
        real_sleep(self, seconds)

    monkeypatch.setattr(runner.VirtualStopper, "sleep", counted)
    scenario = _write(tmp_path, {
        "format": "ledger-scenario", "version": 1, "start": "2027-01-15T00:00Z", "hours": 9,
        "latency": {"medianMs": 1500, "p95Ms": 9000},
        "windows": [{"target": "alpha", "from": "03:00", "for": "50m", "status": 429,
                     "errorCode": "rate_limit_exceeded", "retryAfterS": 700},
                    {"target": "beta", "from": "00:00", "for": "9h", "status": 503,
                     "errorCode": "server_error", "probability": 0.3}],
        "arrivals": [{"at": "00:00", "count": 30}, {"at": "03:10", "count": 12},
                     {"from": "05:00", "until": "06:00", "perHour": 7, "poisson": True},
                     {"at": "08:59:59", "count": 1}],
    })  # fmt: skip
    workload = load_workload(scenario, seed=3)
    catalog = Catalog.model_validate(CATALOG)
    policy = Policy.model_validate({"defaultModel": "alpha/m", "callsPerHour": 25})
    end = workload.end_ms + 6 * 3_600_000
    wakes.append(0)
    jumped = runner.run_policy(workload, policy, catalog, 3, end)
    wakes.append(0)
    walked = runner.run_policy(workload, policy, catalog, 3, end, skip_idle=False)
    assert wakes[0] * 2 < wakes[1]  # most wakes were idle, and were jumped over
    assert jumped.history == walked.history
    assert (jumped.totals, jumped.summary) == (walked.totals, walked.summary)
    assert (jumped.refusals, jumped.outcomes) == (walked.refusals, walked.outcomes)
    assert jumped.bands == walked.bands
    assert (jumped.drained_at_ms, jumped.end_ms) == (walked.drained_at_ms, walked.end_ms)
    assert sum(jumped.refusals.values()) > 0  # the budget-spent polls were not skipped
    assert len(jumped.history.attempts) > 40


def test_r_sim_4_a_month_of_quiet_takes_a_handful_of_wakes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sources 30 days apart: stepping would wake the worker 86,400 times."""
    trace = _write(tmp_path, {
        "format": "ledger-trace", "version": 1,
        "attempts": [{"atMs": 0, "source": 1, "model": "alpha/m", "durationMs": 900},
                     {"atMs": 30 * DAY_MS, "source": 2, "model": "alpha/m", "durationMs": 900}],
        "arrivals": [{"atMs": 0, "source": 1}, {"atMs": 30 * DAY_MS, "source": 2}],
    })  # fmt: skip
    wakes = 0
    real_sleep = runner.VirtualStopper.sleep

    def counted(self: runner.VirtualStopper, seconds: float) -> None:
        nonlocal wakes
        wakes += 1
        assert wakes < 100, "idle virtual time is stepped through"
        real_sleep(self, seconds)

    monkeypatch.setattr(runner.VirtualStopper, "sleep", counted)
    policy = Policy.model_validate({"defaultModel": "alpha/m"})
    document = simulate(trace, policy, Catalog.model_validate(CATALOG)).document
    assert document["current"]["done"] == 2
    assert document["current"]["timeToDrainMs"] >= 30 * DAY_MS
