"""SPEC section 20, R-SC-1: scopes' own budgets, checked in the reserving write transaction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ledger.cli.main import cli
from ledger.config import parse_policy
from ledger.errors import ConfigError, Refused, UsageError
from ledger.records import Success
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import Clock, LedgerFactory, write_policy

HOUR = 3_600_000
DAY = 24 * HOUR
EST = 8192  # alpha/small with no input: the 4096-token reply allowance at $2/MTok, in micro-USD
SCOPES = {
    "nightly": {"callsPerHour": 2},
    "cheap": {"dailyEstimatedUsd": 0.02},  # two estimates of alpha/small fit, a third does not
    "narrow": {"inFlight": 1},
}


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def refused(fn: object) -> Refused:
    with pytest.raises(Refused) as info:
        fn()  # type: ignore[operator]
    return info.value


def counts(home: Path, ledger_db: str | None) -> tuple[int, int, int]:
    url = db_url(home, ledger_db)
    return (
        rows(url, "SELECT COUNT(*) FROM reservations")[0][0],
        rows(url, "SELECT COUNT(*) FROM reservation_scopes")[0][0],
        rows(url, "SELECT COUNT(*) FROM sources")[0][0],
    )


def test_r_sc_1_policy_scopes_parse_and_bad_ones_fail_closed_without_the_value() -> None:
    policy = parse_policy(json.dumps({"scopes": SCOPES}))
    assert policy.scopes["nightly"].calls_per_hour == 2
    assert policy.scopes["cheap"].daily_estimated_usd == 0.02
    assert policy.scopes["narrow"].in_flight == 1
    secret = "sk-live-0123456789abcdef"
    bad = [
        ({"scopes": {"a": {"inFlight": 0}}}, "scopes.<key>.inFlight: must be greater than zero"),
        ({"scopes": {"a": {"callsPerHour": secret}}}, "scopes.<key>.callsPerHour: must be an"),
        ({"scopes": {"a": {"dailyEstimatedUsd": -1}}}, "scopes.<key>.dailyEstimatedUsd: must be"),
        ({"scopes": {secret + " x": {}}}, "scopes.<key>"),  # a name with a space: wrong format
        ({"scopes": {"a": {"inflight": 3}}}, "unknown key"),
        ({"scopes": [secret]}, "scopes: must be an object"),
    ]
    for document, message in bad:
        with pytest.raises(ConfigError) as info:
            parse_policy(json.dumps(document))
        assert message in info.value.message
        assert secret not in info.value.message


def test_r_sc_1_bad_scopes_in_recovery_json_exit_2_and_nothing_is_written(home: Path) -> None:
    secret = "sk-live-0123456789abcdef"
    write_policy(home, scopes={"a": {"inFlight": secret}})
    result = invoke(home, "reserve", "s1", "--model", "alpha/small")
    assert result.exit_code == 2
    assert "recovery.json: scopes.<key>.inFlight" in result.output
    assert secret not in result.output
    assert not (home / "ledger.db").exists()


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_1_scope_hourly_budget_names_the_scope_and_when_it_frees(
    make_ledger: LedgerFactory, clock: Clock, home: Path, ledger_db: str | None
) -> None:
    led = make_ledger(callsPerHour=100, scopes=SCOPES)
    first = clock.ms
    led.reserve("s1", "alpha/small", scopes=["nightly"])
    clock.advance(1000)
    led.reserve("s2", "alpha/small", scopes=["nightly"])
    clock.advance(1000)
    led.reserve("s3", "alpha/small")  # outside the scope: only the global hour counts it
    error = refused(lambda: led.reserve("s4", "alpha/small", scopes=["nightly"]))
    assert (error.reason, error.scope) == ("scope_hourly_budget", "nightly")
    assert error.retry_at_ms == first + HOUR
    assert "nightly" in error.message
    assert counts(home, ledger_db) == (3, 2, 3)
    clock.ms = first + HOUR + 1  # the first one left the scope's rolling hour
    assert led.reserve("s4", "alpha/small", scopes=["nightly"]).id == 4


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_1_scope_daily_cost_counts_settled_cost_and_refuses_with_retry_time(
    make_ledger: LedgerFactory, clock: Clock, home: Path, ledger_db: str | None
) -> None:
    led = make_ledger(callsPerHour=100, scopes=SCOPES)
    start = clock.ms
    a = led.reserve("s1", "alpha/small", scopes=["cheap"])
    clock.advance(1000)
    led.reserve("s2", "alpha/small", scopes=["cheap"])
    assert (a.estimate_micro, counts(home, ledger_db)[1]) == (EST, 2)
    error = refused(lambda: led.reserve("s3", "alpha/small", scopes=["cheap"]))
    assert (error.reason, error.scope) == ("scope_daily_cost", "cheap")
    assert error.retry_at_ms == start + DAY  # when the first estimate leaves the 24 h window
    # the settled actual cost replaces the estimate: 1000 output tokens cost $0.002
    led.settle(a.id, Success(input_tokens=0, output_tokens=1000))
    assert led.reserve("s3", "alpha/small", scopes=["cheap"]).estimate_micro == EST
    assert counts(home, ledger_db) == (3, 3, 3)
    # an unknown price under a scope with a ceiling fails closed, naming the scope
    error = refused(lambda: led.reserve("s4", "beta/free/unknown", scopes=["cheap"]))
    assert (error.reason, error.scope) == ("unknown_price", "cheap")


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_1_in_flight_settled_or_expired_frees_its_slot_at_once(
    make_ledger: LedgerFactory, clock: Clock, home: Path, ledger_db: str | None
) -> None:
    led = make_ledger(callsPerHour=100, timeoutMs=60_000, scopes=SCOPES)
    a = led.reserve("s1", "alpha/small", scopes=["narrow"])
    error = refused(lambda: led.reserve("s2", "alpha/small", scopes=["narrow"]))
    assert (error.reason, error.scope) == ("scope_in_flight", "narrow")
    assert error.retry_at_ms == a.deadline_ms  # at the latest when the open one expires
    led.settle(a.id, Success(input_tokens=1, output_tokens=1))
    b = led.reserve("s2", "alpha/small", scopes=["narrow"])  # settled: free at once
    assert refused(lambda: led.reserve("s3", "alpha/small", scopes=["narrow"])).reason == (
        "scope_in_flight"
    )
    clock.ms = b.deadline_ms  # expired at its deadline: free at once, even before it is marked
    assert led.reserve("s3", "alpha/small", scopes=["narrow"]).id == b.id + 1


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_1_two_scopes_refused_by_whichever_is_spent_nothing_written(
    make_ledger: LedgerFactory, home: Path, ledger_db: str | None
) -> None:
    led = make_ledger(callsPerHour=100, scopes=SCOPES)
    led.reserve("n1", "alpha/small", scopes=["nightly"])
    led.reserve("n2", "alpha/small", scopes=["nightly"])  # nightly is spent
    led.reserve("f1", "alpha/small", scopes=["narrow"])  # narrow is spent
    before = counts(home, ledger_db)
    for asked, spent, reason in (
        (["cheap", "nightly"], "nightly", "scope_hourly_budget"),
        (["narrow", "cheap"], "narrow", "scope_in_flight"),
    ):
        error = refused(lambda asked=asked: led.reserve("new-source", "alpha/small", scopes=asked))
        assert (error.reason, error.scope) == (reason, spent)
        assert counts(home, ledger_db) == before  # no reservation, no scope row, no source
    url = db_url(home, ledger_db)
    assert rows(url, "SELECT COUNT(*) FROM reservation_scopes WHERE scope = 'cheap'") == [(0,)]
    granted = led.reserve("new-source", "alpha/small", scopes=["cheap"])
    assert rows(
        url, "SELECT scope FROM reservation_scopes WHERE reservation_id = :i", i=granted.id
    ) == [("cheap",)]


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_1_source_add_scope_puts_every_reservation_of_it_under_the_scope(
    home: Path, ledger_db: str | None
) -> None:
    write_policy(home, callsPerHour=100, scopes=SCOPES)
    assert invoke(home, "source", "add", "job", "--scope", "narrow").exit_code == 0
    ok = invoke(home, "reserve", "job", "--model", "alpha/small", "--json")
    assert ok.exit_code == 0, ok.output
    again = invoke(home, "reserve", "job", "--model", "alpha/small", "--json")
    assert again.exit_code == 3
    error = json.loads(again.output)["error"]
    assert (error["code"], error["scope"]) == ("scope_in_flight", "narrow")
    assert error["retry_at"] is not None
    assert "settling one frees a slot" in error["hint"]
    text = invoke(home, "reserve", "job", "--model", "alpha/small")
    assert text.exit_code == 3
    assert "scope_in_flight (scope narrow); retry at" in text.output
    url = db_url(home, ledger_db)
    assert rows(url, "SELECT source_id, scope FROM source_scopes") == [("job", "narrow")]


def test_r_sc_1_reserve_scope_is_repeatable_on_the_cli(home: Path) -> None:
    write_policy(home, callsPerHour=100, scopes=SCOPES)
    ok = invoke(home, "reserve", "s1", "--model", "alpha/small", "--scope", "nightly",
                "--scope", "narrow", "--json")
    assert ok.exit_code == 0, ok.output
    url = db_url(home, None)
    assert rows(url, "SELECT scope FROM reservation_scopes ORDER BY scope") == [
        ("narrow",), ("nightly",)
    ]
    error = json.loads(
        invoke(home, "reserve", "s2", "--model", "alpha/small", "--scope", "nightly",
               "--scope", "narrow", "--json").output
    )["error"]
    assert (error["code"], error["scope"]) == ("scope_in_flight", "narrow")


def test_r_sc_1_unknown_scope_is_a_usage_error_never_echoed_when_not_printable(
    home: Path, make_ledger: LedgerFactory
) -> None:
    write_policy(home, scopes=SCOPES)
    typo = invoke(home, "reserve", "s1", "--model", "alpha/small", "--scope", "nigthly")
    assert typo.exit_code == 2
    assert "unknown scope nigthly" in typo.output
    odd = "\x1b[2Jsk-live-secret"
    hidden = invoke(home, "reserve", "s1", "--model", "alpha/small", "--scope", odd)
    assert hidden.exit_code == 2
    assert "unknown scope" in hidden.output
    assert "sk-live-secret" not in hidden.output
    assert "\x1b" not in hidden.output
    added = invoke(home, "source", "add", "s1", "--scope", "nigthly")
    assert added.exit_code == 2
    assert not (home / "ledger.db").exists()  # nothing written by any of them
    led = make_ledger(scopes=SCOPES)
    with pytest.raises(UsageError):
        led.reserve("s1", "alpha/small", scopes="nightly")  # a bare string is not a list
    with pytest.raises(UsageError):
        led.reserve("s1", "alpha/small", scopes=[3])  # type: ignore[list-item]


def test_r_sc_1_a_source_scope_the_policy_dropped_no_longer_limits(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(scopes=SCOPES)
    led.add_source("job", scopes=["narrow"])
    led.reserve("job", "alpha/small")
    assert refused(lambda: led.reserve("job", "alpha/small")).reason == "scope_in_flight"
    relaxed = make_ledger(scopes={"nightly": {"callsPerHour": 5}})
    assert relaxed.reserve("job", "alpha/small").id == 2


def test_r_db_6_compaction_folds_scoped_reservations_too(
    make_ledger: LedgerFactory, clock: Clock, home: Path
) -> None:
    led = make_ledger(scopes=SCOPES, retentionDays=1)
    res = led.reserve("s1", "alpha/small", scopes=["nightly", "cheap"])
    led.settle(res.id, Success(input_tokens=1, output_tokens=1))
    clock.advance(3 * DAY)
    assert led.compact(100) == 1
    assert counts(home, None) == (0, 0, 1)


def test_r_sc_1_config_validate_reports_a_scope_nothing_uses(home: Path) -> None:
    write_policy(home, scopes={**SCOPES, "spare": {"inFlight": 2}, "bykey": {"inFlight": 2}})
    before = invoke(home, "config", "validate", "--json")
    assert before.exit_code == 0, before.output
    assert not (home / "ledger.db").exists()  # validating creates nothing
    unused = [w for w in json.loads(before.output)["warnings"] if w.startswith("scope ")]
    assert len(unused) == 5
    assert invoke(home, "source", "add", "job", "--scope", "narrow").exit_code == 0
    assert invoke(home, "key", "create", "k", "--scope", "bykey").exit_code == 0
    assert invoke(home, "reserve", "s1", "--model", "alpha/small", "--scope", "nightly",
                  "--scope", "cheap").exit_code == 0
    after = invoke(home, "config", "validate")
    assert after.exit_code == 0
    assert "warning: scope spare: no source, key or reservation" in after.output
    for used in ("narrow", "bykey", "nightly", "cheap"):
        assert f"scope {used}:" not in after.output


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_1_scope_hour_totals_keep_the_24h_cost_exact_across_hours_and_settles(
    make_ledger: LedgerFactory, clock: Clock, home: Path, ledger_db: str | None
) -> None:
    from ledger.classify import classify_kind
    from ledger.records import Cancelled, Failed
    from ledger.status.document import build_status

    led = make_ledger(callsPerHour=10_000, sourceCalls=10_000, timeoutMs=60_000,
                      scopes={"a": {"dailyEstimatedUsd": 1000}, "b": {"callsPerHour": 10_000}})
    url = db_url(home, ledger_db)
    open_ids: list[int] = []
    for step in range(90):  # 30 hours in 20-minute steps: the window's edge cuts through hours
        clock.advance(20 * 60_000)
        scopes = [["a"], ["b"], ["a", "b"]][step % 3]
        res = led.reserve(f"s{step}", "alpha/small", input_bytes=step, scopes=scopes)
        open_ids.append(res.id)
        if step % 4 == 0:
            led.settle(open_ids.pop(0), Success(input_tokens=step, output_tokens=step * 3))
        elif step % 4 == 1:
            led.settle(open_ids.pop(0), Failed(classify_kind("transport"), input_tokens=5,
                                               output_tokens=0))
        elif step % 4 == 2:
            led.settle(open_ids.pop(0), Cancelled())
        since = clock.ms - DAY
        for scope in ("a", "b"):
            (expected,), = rows(
                url,
                "SELECT COALESCE(SUM(r.cost_micro), 0) FROM reservation_scopes s JOIN"
                " reservations r ON r.id = s.reservation_id WHERE s.scope = :s"
                " AND s.created_ms > :since",
                s=scope, since=since,
            )
            shown = {x["name"]: x for x in build_status(led)["scopes"]}[scope]
            assert round(shown["daily"]["spent_usd"] * 1_000_000) == int(expected), (step, scope)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_1_scope_hour_calls_keep_the_rolling_hour_exact_across_hour_edges(
    make_ledger: LedgerFactory, clock: Clock, home: Path, ledger_db: str | None
) -> None:
    """A scope's rolling-hour count reads whole hours from its hour totals and only the partial
    hour before them row by row (revision 0008): it equals the rows of the last hour at every
    step, with steps landing on, just before and just after hour edges and the window's edge."""
    from ledger.status.document import build_status

    led = make_ledger(callsPerHour=10_000, sourceCalls=10_000, timeoutMs=60_000,
                      scopes={"b": {"callsPerHour": 10_000}})
    url = db_url(home, ledger_db)
    clock.ms = clock.ms - clock.ms % HOUR + HOUR  # on an hour edge
    steps = [0, 1, 7 * 60_000, HOUR - 1, 1, 1, 13 * 60_000, HOUR - 13 * 60_000 - 2, 2, 1]
    steps += [11 * 60_000] * 14
    for step, gap in enumerate(steps):
        clock.advance(gap)
        for i in range(1 + step % 3):  # several at one time too
            led.reserve(f"s{step}-{i}", "alpha/small", scopes=["b"])
        for probe in (0, 1, HOUR - 1):  # also read later, without a reservation at that time
            clock.advance(probe)
            (expected,), = rows(
                url, "SELECT COUNT(*) FROM reservation_scopes WHERE scope = 'b'"
                " AND created_ms > :since", since=clock.ms - HOUR,
            )
            shown = {x["name"]: x for x in build_status(led)["scopes"]}["b"]
            assert shown["hourly"]["used"] == int(expected), (step, probe)
            clock.advance(-probe)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_1_scope_hourly_budget_is_exact_when_the_hour_edge_cuts_the_window(
    make_ledger: LedgerFactory, clock: Clock, home: Path, ledger_db: str | None
) -> None:
    """Two calls late in one hour, one early in the next: under callsPerHour 3 the fourth is
    refused until the first leaves the rolling hour, exactly then (not at an hour edge)."""
    led = make_ledger(callsPerHour=100, scopes={"b": {"callsPerHour": 3}})
    clock.ms = clock.ms - clock.ms % HOUR + HOUR - 10 * 60_000  # 10 minutes before an edge
    first = clock.ms
    led.reserve("s1", "alpha/small", scopes=["b"])
    clock.advance(5 * 60_000)
    led.reserve("s2", "alpha/small", scopes=["b"])
    clock.advance(10 * 60_000)  # 5 minutes into the next hour
    led.reserve("s3", "alpha/small", scopes=["b"])
    clock.ms = first + HOUR  # the first left the rolling hour (now - 1 h, now] exactly now
    led.reserve("s4", "alpha/small", scopes=["b"])
    clock.ms = first + HOUR + 1
    error = refused(lambda: led.reserve("s5", "alpha/small", scopes=["b"]))
    assert (error.reason, error.scope) == ("scope_hourly_budget", "b")
    assert error.retry_at_ms == first + 5 * 60_000 + HOUR  # when s2 leaves
    clock.ms = first + 5 * 60_000 + HOUR
    assert led.reserve("s5", "alpha/small", scopes=["b"]).id == 5


def test_r_sc_1_client_and_v1_reserve_carry_scopes_and_the_refusal_names_it(home: Path) -> None:
    from ledger.client import LedgerClient
    from tests.support.serving import running

    write_policy(home, callsPerHour=100, scopes=SCOPES)
    with running(home) as served, LedgerClient(served.socket, home=home) as client:
        assert client.add_source("job", scopes=["narrow"]) is True
        client.reserve("job", "alpha/small")
        error = refused(lambda: client.reserve("other", "alpha/small", scopes=["narrow"]))
        assert (error.reason, error.scope) == ("scope_in_flight", "narrow")
        assert error.retry_at_ms is not None
        with served.client() as http:
            answer = http.post("/v1/reserve", json={"source": "x", "model": "alpha/small",
                                                    "scopes": ["narrow"]})
            assert answer.status_code == 409
            assert answer.json()["error"]["scope"] == "narrow"
            bad = http.post("/v1/reserve", json={"source": "x", "model": "alpha/small",
                                                 "scopes": ["nope"]})
            assert bad.status_code == 400
            assert "unknown scope nope" in bad.json()["error"]["message"]
    url = db_url(home, None)
    assert rows(url, "SELECT source_id, scope FROM source_scopes") == [("job", "narrow")]
