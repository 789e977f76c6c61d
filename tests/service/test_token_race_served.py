"""R-TOK-2 across every way a job reserves: sixteen processes (the library, `ledger reserve
--json` in a process per call, and `LedgerClient` over `/v1` of a real `ledger serve`) reserve at
once under three `tokensPerMinute` windows: a model's (alpha/small), a provider's (alpha) and a
scope's (tok). On SQLite through one service; on PostgreSQL through two services on one database.

The ledger's clock is held still for every process, services included: the clock row (the newest
time ever stored, which ledger time never goes below, R-DB-3b) is set ten minutes ahead of the
wall clock before the race, so every grant falls at that one moment and the windows only fill.
Then: no window's granted estimates add up past its limit, and every refusal names a window
that the request's estimate would not have fit in at the end (no under-grant: with the clock
still, a window refused earlier is no emptier now).

Traffic: alpha/small without a scope meets the model and provider windows; alpha/big without a
scope the provider window only; beta/mid under the scope the scope window only.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.kinds import RefusalReason
from tests.support.backends import fresh_pg_database, pg_server_url, rows, write
from tests.support.ledgers import TEST_CATALOG
from tests.support.procs import planned_racer, race, write_home
from tests.support.serving import Served, running

REPLY = 500
MODEL_LIMIT = 1_500  # alpha/small
PROVIDER_LIMIT = 6_000  # alpha
SCOPE_LIMIT = 3_000  # tok
POLICY: dict[str, Any] = {
    "callsPerHour": 100_000,
    "sourceCalls": 100,
    "replyTokens": REPLY,
    "tokenBudgets": {
        "alpha/small": {"tokensPerMinute": MODEL_LIMIT},
        "alpha": {"tokensPerMinute": PROVIDER_LIMIT},
    },
    "scopes": {"tok": {"tokensPerMinute": SCOPE_LIMIT}},
}
CLASSES: list[tuple[str, tuple[str, ...]]] = [
    ("alpha/small", ()),
    ("alpha/big", ()),
    ("beta/mid", ("tok",)),
]
# 16 processes: 6 library, 6 LedgerClient through the service(s), 4 CLI (a process per call)
HOWS = ["library"] * 6 + ["client"] * 6 + ["cli"] * 4
ATTEMPTS = {"library": 9, "client": 9, "cli": 3}
NAMED = re.compile(r"tokensPerMinute (\d+) of (provider|model|scope) ([\w/.-]+)")


def _plan(tag: int, how: str) -> list[tuple[str, int, tuple[str, ...]]]:
    """Each process's attempts: the three kinds of traffic in turn, 100..400 input tokens."""
    return [
        (*CLASSES[(tag + i) % 3][:1], 300 * (1 + (tag + i) % 4), CLASSES[(tag + i) % 3][1])
        for i in range(ATTEMPTS[how])
    ]


def _windows(model: str, scopes: tuple[str, ...]) -> set[tuple[str, str]]:
    """The token windows a request is checked against, as (dimension, name)."""
    found = {("scope", scope) for scope in scopes}
    if model == "alpha/small":
        found.add(("model", model))
    if model.startswith("alpha/"):
        found.add(("provider", "alpha"))
    return found


LIMITS = {("model", "alpha/small"): MODEL_LIMIT, ("provider", "alpha"): PROVIDER_LIMIT,
          ("scope", "tok"): SCOPE_LIMIT}  # fmt: skip


def _estimates(tmp_path: Path) -> dict[tuple[str, int], int]:
    """Each (model, input bytes)'s token estimate, from a ledger with no token budget."""
    home = tmp_path / "scratch"
    write_home(home, TEST_CATALOG, callsPerHour=100_000, sourceCalls=100, replyTokens=REPLY)
    led = Ledger.open(home, env={})
    try:
        return {
            (model, size): led.reserve(f"e-{model}-{size}", model, input_bytes=size).estimate_tokens
            for model, _ in CLASSES
            for size in (300, 600, 900, 1200)
        }
    finally:
        led.close()


def _hold_clock(url: str) -> int:
    """Ledger time, held ten minutes ahead of the wall clock for every process until then."""
    held = int(time.time() * 1000) + 600_000
    write(url, "DELETE FROM clock")
    write(url, "INSERT INTO clock (id, newest_ms) VALUES (1, :held)", held=held)
    return held


@contextmanager
def _services(homes: list[Path], db: str | None) -> Iterator[list[Served]]:
    with ExitStack() as stack:
        yield [stack.enter_context(running(home, db=db)) for home in homes]


def _check_race(tmp_path: Path, homes: list[Path], url: str, db: str | None) -> None:
    estimate = _estimates(tmp_path)
    for home in homes:
        write_home(home, TEST_CATALOG, **POLICY)
    Ledger.open(homes[0], db, env={}).close()  # the schema, once, before the race
    held = _hold_clock(url)
    plans = [_plan(tag, how) for tag, how in enumerate(HOWS)]
    with _services(homes, db) as services:

        def args(tag: int, barrier: Any, out: Any) -> tuple[Any, ...]:
            how = HOWS[tag]
            home = homes[tag % len(homes)]
            target = services[tag % len(services)].socket if how == "client" else home
            return how, str(target), db, tag, plans[tag], barrier, out

        started = time.monotonic()
        reports = race(planned_racer, len(HOWS), args, timeout_s=600)
        took = time.monotonic() - started
    assert [e for r in reports for e in r["errors"]] == []
    granted = {rid: plans[r["tag"]][i] for r in reports for i, rid in r["granted"]}
    stored = rows(url, "SELECT id, model_key, created_ms, estimate_input_tokens"
                       " + estimate_output_tokens FROM reservations")  # fmt: skip
    assert sorted(int(r[0]) for r in stored) == sorted(granted)  # none lost, none counted twice
    assert {int(r[2]) for r in stored} == {held}  # every grant at the one held moment
    in_scope = {int(r[0]) for r in rows(url, "SELECT reservation_id FROM reservation_scopes"
                                             " WHERE scope = 'tok'")}  # fmt: skip
    used: Counter[tuple[str, str]] = Counter()
    for rid, model, _, tokens in stored:
        scopes = ("tok",) if int(rid) in in_scope else ()
        assert (model, scopes) == (granted[int(rid)][0], granted[int(rid)][2])
        assert int(tokens) == estimate[model, granted[int(rid)][1]]
        for window in _windows(model, scopes):
            used[window] += int(tokens)
    for window, limit in LIMITS.items():
        assert used[window] <= limit, window  # never an overshoot
    named: Counter[tuple[str, str]] = Counter()
    for report in reports:
        for i, reason, message in report["refused"]:
            model, size, scopes = plans[report["tag"]][i]
            assert reason == RefusalReason.TOKEN_BUDGET, message
            match = NAMED.search(message)
            assert match is not None, message
            window = (match[2], match[3])
            assert window in _windows(model, tuple(scopes))  # the window it was checked in
            assert int(match[1]) == LIMITS[window]
            assert used[window] + estimate[model, size] > LIMITS[window]  # never an under-grant
            named[window] += 1
    assert set(named) == set(LIMITS), named  # the race filled every one of the three windows
    attempts = sum(len(p) for p in plans)
    print(f"token race: {len(HOWS)} processes, {len(homes)} service(s), {attempts} attempts,"
          f" {len(granted)} granted, refusals by window {dict(named)}, use {dict(used)},"
          f" {took:.1f} s")


@pytest.mark.timeout(900)
def test_r_tok_2_library_cli_and_v1_processes_hold_model_provider_and_scope_windows_sqlite(
    tmp_path: Path,
) -> None:
    home = tmp_path / "state"
    _check_race(tmp_path, [home], f"sqlite:///{home / 'ledger.db'}", None)


@pytest.mark.timeout(900)
def test_r_tok_2_two_services_on_one_postgresql_hold_the_three_windows(tmp_path: Path) -> None:
    pg_server_url()
    with fresh_pg_database() as url:
        _check_race(tmp_path, [tmp_path / "a", tmp_path / "b"], url, url)
