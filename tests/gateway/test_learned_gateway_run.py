"""R-TOK-4 over a run: 200 calls through a real `ledger serve` gateway to a stand-in that holds a
token rate limit (LIMIT tokens a WINDOW_S-second window, per model, answering 429 to a call whose
tokens do not fit) and reports what is left on every answer (`x-ratelimit-remaining-tokens`,
`x-ratelimit-reset-tokens`). Four clients send at once; a refused call waits a moment and is
sent again, until each of the 200 is answered. A 429 from the stand-in cools the model for a
minute (the rate-limit row of the policy table); the test clears that cooldown at once, as an
operator could, so the run measures the token limit rather than the cooldown.

A 429 the stand-in sent was foreseeable when, at the reserve of its call (the reservation's
ledger time), a reading was available (its call's settle committed earlier) and live (its window
had not reset), and the newest such reading's remaining, minus the estimates of the calls granted
after it became available, was less than the call's estimate. With learned limits on, none is;
with them off (the control), the same check finds some, so it can see one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from ledger.standin.server import Metered, Scripted, StandIn
from tests.support.backends import rows
from tests.support.gateway_setup import gateway

LIMIT = 1_000  # tokens per window the stand-in holds
WINDOW_S = 1.0
CHARGE = Scripted(input_tokens=60, output_tokens=40)  # each answer: 100 tokens
CLIENTS = 4


def _run(home: Path, calls: int, learn: bool) -> tuple[list[Metered], list[tuple[Any, ...]], float]:
    """Send `calls` calls (each until answered); the stand-in's decisions, every reservation's
    (source, created, settled, estimate) and the seconds the run took."""
    policy = {"callsPerHour": 100_000, "sourceCalls": 100, "replyTokens": 100,
              "crossProviderFallback": False, "learnLimits": learn}  # fmt: skip
    standin = StandIn(default=CHARGE, tokens_per_minute=LIMIT, enforce_tokens=True,
                      token_window_s=WINDOW_S)  # fmt: skip
    errors: list[str] = []
    with standin, gateway(home, standin, **policy) as gw:
        todo = list(range(calls))
        lock = threading.Lock()
        cleared = [0]  # the stand-in's 429s whose cooldown was cleared

        def clear_cooldown(http: httpx.Client) -> None:
            with lock:
                seen = sum(not one.answered for one in standin.metered)
                if seen == cleared[0]:
                    return
                cleared[0] = seen
            done = http.delete("/v1/cooldowns/acme/a1", params={"force": "true"})
            if done.status_code != 200:
                errors.append(f"clear: {done.status_code}")

        def client() -> None:
            with httpx.Client(base_url=gw.url, timeout=60,
                              headers={"authorization": f"Bearer {gw.token}"}) as http:  # fmt: skip
                while True:
                    with lock:
                        if not todo:
                            return
                        call = todo.pop()
                    for attempt in range(1000):
                        marker = f"c{call}-{attempt}"
                        answer = http.post(
                            "/openai/v1/chat/completions",
                            headers={"x-ledger-source": marker},
                            json={"model": "acme/a1", "max_tokens": 100,
                                  "messages": [{"role": "user", "content": marker}]},
                        )  # fmt: skip
                        if answer.status_code == 200:
                            break
                        if answer.status_code != 429:
                            errors.append(f"{answer.status_code}")
                            return
                        clear_cooldown(http)
                        time.sleep(0.05)

        started = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        took = time.monotonic() - started
        metered = standin.metered
    assert errors == []
    stored = rows(f"sqlite:///{home / 'ledger.db'}",
                  "SELECT source_id, created_ms, settled_ms,"
                  " estimate_input_tokens + estimate_output_tokens FROM reservations")  # fmt: skip
    return metered, stored, took


def _foreseeable(metered: list[Metered], stored: list[tuple[Any, ...]]) -> list[str]:
    """The calls the stand-in answered 429 that the reading available at their reserve said
    would not fit (see the module's docstring)."""
    by_source = {str(s): (int(c), None if d is None else int(d), int(e)) for s, c, d, e in stored}
    readings = []  # (decided at, left, reset at ms, available from ms)
    for one in metered:
        source = one.body["messages"][0]["content"]
        settled = by_source[source][1]
        if settled is not None:
            readings.append((one.at_s, one.left, one.reset_at_s * 1000, settled))
    found = []
    for one in metered:
        if one.answered:
            continue
        source = one.body["messages"][0]["content"]
        created, _, estimate = by_source[source]
        live = [r for r in readings if r[3] < created < r[2]]
        if not live:
            continue
        _, left, _, available = max(live)  # the newest reading available then
        since = sum(e for c, _, e in by_source.values() if available < c < created)
        if left - since < estimate:
            found.append(source)
    return found


def test_r_tok_4_no_foreseeable_429_reaches_the_provider_in_a_200_call_run(tmp_path: Path) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    metered, stored, took = _run(home, 200, learn=True)
    answered = sum(one.answered for one in metered)
    refused_upstream = len(metered) - answered
    foreseeable = _foreseeable(metered, stored)
    print(f"learned limits on: 200 calls in {took:.1f} s, {len(metered)} sent to the stand-in,"
          f" {refused_upstream} answered 429, {len(foreseeable)} of them foreseeable")
    assert answered == 200
    assert foreseeable == []
    # the limit did bite: 20,000 tokens through a 1,000-token window took many windows
    assert took >= (200 * 100 / LIMIT - 1) * WINDOW_S


def test_r_tok_4_without_learned_limits_the_same_run_sends_foreseeable_429s(
    tmp_path: Path,
) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    metered, stored, took = _run(home, 60, learn=False)
    foreseeable = _foreseeable(metered, stored)
    print(f"learned limits off: 60 calls in {took:.1f} s, {len(metered)} sent to the stand-in,"
          f" {len(metered) - 60} answered 429, {len(foreseeable)} of them foreseeable")
    assert foreseeable  # the check sees a 429 the readings foretold
