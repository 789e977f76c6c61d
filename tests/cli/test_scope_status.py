"""R-SC-2: the status document (text, JSON, Prometheus with a `scope` label, page) shows each
scope's use against its limits and when its next slot frees."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledger.catalog import Catalog
from ledger.clock import iso
from ledger.page.render import render_page
from ledger.records import Success
from ledger.simulate.simulation import simulate
from ledger.status.document import build_status, render_prometheus, render_text
from tests.support.backends import BACKENDS
from tests.support.ledgers import Clock, LedgerFactory

HOUR = 3_600_000
SCOPES = {
    "nightly": {"callsPerHour": 2, "dailyEstimatedUsd": 5},
    "team": {"inFlight": 2},
    "idle": {"inFlight": 9},
}


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_2_status_shows_each_scope_against_its_limits(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    led = make_ledger(callsPerHour=100, timeoutMs=60_000, scopes=SCOPES)
    first = clock.ms
    a = led.reserve("s1", "alpha/small", scopes=["nightly", "team"])
    clock.advance(1000)
    b = led.reserve("s2", "alpha/small", scopes=["nightly", "team"])
    led.settle(a.id, Success(input_tokens=0, output_tokens=1000))  # $0.002 actual
    clock.advance(1000)
    c = led.reserve("s3", "alpha/small", scopes=["team"])
    doc = build_status(led)
    by_name = {s["name"]: s for s in doc["scopes"]}
    assert list(by_name) == ["idle", "nightly", "team"]
    nightly, team = by_name["nightly"], by_name["team"]
    assert nightly["hourly"] == {"used": 2, "limit": 2, "next_free_at": iso(first + HOUR)}
    assert nightly["daily"] == {"spent_usd": 0.002 + 0.008192, "ceiling_usd": 5.0}
    assert team["in_flight"] == {"open": 2, "limit": 2, "next_free_at": iso(b.deadline_ms)}
    assert team["hourly"]["limit"] is None
    assert team["hourly"]["used"] == 3
    assert by_name["idle"]["in_flight"] == {"open": 0, "limit": 9, "next_free_at": None}
    assert c.deadline_ms > b.deadline_ms

    text = render_text(doc)
    assert "scope nightly FULL (hourly): calls 2 / 2 this hour (next slot " in text  # R-DIAG-1
    assert "scope team FULL (in_flight): calls 3 this hour;" in text
    assert "open 2 / 2 (a slot frees by" in text

    metrics = {
        (f.name, sample.labels.get("scope")): sample.value
        for f in text_string_to_metric_families(render_prometheus(doc))
        for sample in f.samples
        if f.name.startswith("ledger_scope_")
    }
    assert metrics[("ledger_scope_in_flight", "team")] == 2
    assert metrics[("ledger_scope_in_flight_limit", "team")] == 2
    assert metrics[("ledger_scope_hourly_calls_used", "nightly")] == 2
    assert metrics[("ledger_scope_hourly_calls_limit", "nightly")] == 2
    assert metrics[("ledger_scope_daily_ceiling_usd", "nightly")] == 5
    assert ("ledger_scope_in_flight_limit", "nightly") not in metrics  # no such limit set

    page = render_page(doc)
    assert '<section id="scopes"' in page
    assert '<tr data-scope="team" class="full">' in page  # R-DIAG-1: at its inFlight
    assert "2 / 2" in page

    led.settle(b.id, Success(input_tokens=0, output_tokens=1))  # settled: its slot frees at once
    assert {s["name"]: s for s in build_status(led)["scopes"]}["team"]["in_flight"] == {
        "open": 1, "limit": 2, "next_free_at": None
    }


def test_r_sc_2_no_scopes_no_section(make_ledger: LedgerFactory) -> None:
    led = make_ledger()
    led.reserve("s1", "alpha/small")
    doc = build_status(led)
    assert doc["scopes"] == []
    assert "scope " not in render_text(doc)
    assert 'id="scopes"' not in render_page(doc)


def test_r_sc_1_simulate_honours_a_scope_the_candidate_policy_sets(tmp_path: Path) -> None:
    from tests.support.simulation import CATALOG, _policy, _scenario

    scenario = _scenario(
        tmp_path,
        arrivals=[{"at": "00:00", "count": 100, "scopes": ["nightly"]},
                  {"at": "00:00", "count": 100}],
    )
    result = simulate(
        scenario, _policy(callsPerHour=40), Catalog.model_validate(CATALOG),
        candidate=_policy(callsPerHour=40, scopes={"nightly": {"callsPerHour": 10}}),
        drain_for_ms=0,
    ).document
    current, candidate = result["current"], result["candidate"]
    # the budget is the same; the scope holds its sources to 10 calls an hour in the candidate
    assert current["calls"] == candidate["calls"] == 3 * 40
    assert "scope_hourly_budget" not in current["refusals"]
    assert candidate["refusals"]["scope_hourly_budget"] > 0
