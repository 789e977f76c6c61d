"""R-DIAG-1/2/5, R-HOME-3, R-DB-3a: `ledger status` (text, JSON, Prometheus) and `source show`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from ledger.api import Ledger
from ledger.classify import classify_exception, classify_http, classify_kind
from ledger.kinds import AttemptRole
from ledger.records import Failed, SettleResult, Success
from ledger.status.document import RouteView, render_prometheus, render_text, status_document
from ledger.store.status_views import status_data
from tests.support.backends import BACKENDS
from tests.support.ledgers import Clock, LedgerFactory, write_policy
from tests.support.status_cli import cli, cli_ok, status_json

# The contract suite (R-DB-7): every case here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)

POLICY = {"defaultModel": "alpha/small", "callsPerHour": 30}
LONG_ID = "s" * 200


@dataclass
class Scene:
    """A ledger with a finished fallback, an unknown-cost attempt, a paused and a queued source."""

    ledger: Ledger
    results: list[SettleResult]
    open_ids: list[int]


@pytest.fixture
def scene(home: Path, make_ledger: LedgerFactory, clock: Clock) -> Scene:
    write_policy(home, **POLICY)
    led = make_ledger()  # reads recovery.json like the CLI does: same fingerprint
    results: list[SettleResult] = []
    # a primary that hits a rate limit, then a successful immediate fallback that finishes
    first = led.reserve("src-fb", "beta/mid", input_bytes=1000)
    results.append(led.settle(first.id, Failed(classify_http(429, {}, None, clock.ms))))
    clock.advance(1000)
    fb = led.reserve(
        "src-fb",
        "alpha/small",
        input_bytes=1000,
        role=AttemptRole.FALLBACK,
        fallback_from="beta/mid",
    )
    clock.advance(2500)
    results.append(led.settle(fb.id, Success(100, 50, finish=True)))
    # an attempt whose cost is unknown (no price, no usage)
    unk = led.reserve("src-unknown", "beta/free/unknown", input_bytes=10)
    results.append(led.settle(unk.id, Success()))
    # a safety refusal pauses its source
    bad = led.reserve(LONG_ID, "alpha/big", input_bytes=10)
    results.append(led.settle(bad.id, Failed(classify_kind("safety"))))
    # a transport failure sets a backoff; one reservation stays open
    tr = led.reserve("src-retry", "alpha/small", input_bytes=10)
    results.append(led.settle(tr.id, Failed(classify_exception(httpx.ConnectError("x")))))
    still_open = led.reserve("src-open", "alpha/small", input_bytes=10)
    led.add_source("src-queued")
    return Scene(led, results, [still_open.id])


def test_r_diag_2_json_shape_and_values(scene: Scene, home: Path) -> None:
    cli_ok(home, "cooldown", "set", "gamma", "2h")
    doc = status_json(home)
    assert set(doc) >= {
        "now", "default_model", "routes", "excluded", "cooldowns", "hourly", "daily", "history",
        "sources", "recent", "outcomes_24h", "notices", "store", "policy", "warnings",
    }  # fmt: skip
    assert doc["default_model"] == "alpha/small"
    assert doc["hourly"] == {"used": 6, "limit": 30, "next_free_at": None}
    known = [r.cost_micro for r in scene.results if r.cost_micro is not None]
    daily = doc["daily"]
    # the open reservation counts with its estimate, like the ceiling does (R-RES-2)
    open_estimate = 10 * 1 + 4096 * 2
    assert daily["spent_usd"] == pytest.approx((sum(known) + open_estimate) / 1e6)
    assert daily["unknown_cost_attempts"] == 1
    assert (daily["input_tokens"], daily["output_tokens"]) == (100, 50)
    assert daily["ceiling_usd"] is None
    assert daily["attempts"] == 6
    counts = doc["sources"]["counts"]
    assert counts == {"queued": 4, "leased": 0, "done": 1, "paused": 1, "gateway_one_off": 0}
    listed = {s["id"]: s for s in doc["sources"]["list"]}
    assert listed[LONG_ID]["pause_reason"] == scene.results[3].paused
    assert listed[LONG_ID]["state"] == "paused"
    assert listed["src-retry"]["retry_at"] is not None
    assert listed["src-fb"]["calls"] == 2
    assert listed["src-fb"]["models"] == ["alpha/small", "beta/mid"]
    assert listed["src-fb"]["time_used_ms"] == 2500
    # paused first, then queued (most recently checked first), then done
    order = [s["state"] for s in doc["sources"]["list"]]
    assert order == sorted(order, key=["leased", "paused", "queued", "done"].index)
    recent = doc["recent"]
    assert len(recent) == 6
    assert recent[0]["source"] == "src-open"
    fallback = next(a for a in recent if a["role"] == "fallback")
    assert (fallback["model"], fallback["status"], fallback["duration_ms"]) == (
        "alpha/small",
        "succeeded",
        2500,
    )
    limited = next(a for a in recent if a["kind"] == "rate_limit")
    assert limited["subkind"] == "http_429"
    cooldowns = {(c["scope"], c["target"]): c for c in doc["cooldowns"]}
    assert cooldowns[("provider", "gamma")]["origin"] == "manual"
    assert cooldowns[("provider", "gamma")]["remaining_s"] == pytest.approx(7200, abs=1)
    assert cooldowns[("model", "beta/mid")]["kind"] == "rate_limit"
    assert any(n["category"] == "fallback" for n in doc["notices"])
    assert doc["policy"]["warning"] is None
    assert [w["current"] for w in doc["policy"]["writers"]] == [True]
    store = doc["store"]
    assert store["journal_mode"] == store["journal_mode_chosen"]
    if store["backend"] == "sqlite":
        assert re.fullmatch(r"\d+\.\d+\.\d+", store["sqlite_version"])
    else:  # SQLite facts are not invented for PostgreSQL
        assert (store["backend"], store["sqlite_version"], store["journal_mode"]) == (
            "postgresql", None, None)
    assert store["revision"]
    assert store["network_filesystem"] is None
    assert doc["now"].endswith("Z")


def test_r_diag_1_routes_for_a_fresh_source(scene: Scene, home: Path) -> None:
    doc = status_json(home)
    # beta/mid cools (rate limit); gamma has no credential here
    assert doc["routes"][0] == "alpha/small"
    assert "beta/mid" not in doc["routes"]
    reasons = {e["model"]: e["reason"] for e in doc["excluded"]}
    assert reasons["beta/mid"] == "model_cooldown"
    assert reasons["gamma/g1"] == "unavailable"
    cli_ok(home, "cooldown", "set", "alpha", "1h")
    doc = status_json(home)
    assert "alpha/small" not in doc["routes"]
    assert {e["model"]: e["reason"] for e in doc["excluded"]}["alpha/small"] == "provider_cooldown"


def test_r_diag_2_daily_ceiling_and_history(
    home: Path, make_ledger: LedgerFactory, clock: Clock
) -> None:
    write_policy(home, dailyEstimatedUsd=2.5)
    led = make_ledger()
    r = led.reserve("s1", "alpha/small", input_bytes=10)
    led.settle(r.id, Success(1000, 1000))
    with led.db.write() as txn:
        txn.conn.exec_driver_sql(
            "INSERT INTO daily_totals (day, model_key, attempts, succeeded, failed, cancelled, "
            "expired, input_tokens, output_tokens, cost_micro, unknown_cost) "
            "VALUES ('2026-12-01', 'alpha/small', 3, 2, 1, 0, 0, 300, 200, 1500, 1)"
        )
    doc = status_json(home)
    assert doc["daily"]["ceiling_usd"] == 2.5
    assert doc["daily"]["spent_usd"] == pytest.approx(0.003)
    assert doc["history"] == [
        {
            "day": "2026-12-01",
            "attempts": 3,
            "succeeded": 2,
            "failed": 1,
            "input_tokens": 300,
            "output_tokens": 200,
            "cache_write_tokens": 0,
            "cache_read_tokens": 0,
            "spent_usd": 0.0015,
            "unknown_cost_attempts": 1,
        }
    ]
    assert "2026-12-01" in cli_ok(home, "status")


def test_r_home_3_fingerprint_warning_for_another_policy(
    scene: Scene, home: Path, make_ledger: LedgerFactory
) -> None:
    stale = make_ledger(callsPerHour=29, defaultModel="alpha/small")
    assert stale.fingerprint != scene.ledger.fingerprint
    stale.reserve("src-stale", "alpha/small")
    doc = status_json(home)
    writers = {w["fingerprint"]: w for w in doc["policy"]["writers"]}
    assert writers[stale.fingerprint]["current"] is False
    assert writers[scene.ledger.fingerprint]["current"] is True
    assert stale.fingerprint in doc["policy"]["warning"]
    assert doc["policy"]["warning"] in doc["warnings"]
    text = cli_ok(home, "status")
    assert "WARNING" in text
    assert stale.fingerprint in text
    prom = {
        f.name: f for f in text_string_to_metric_families(cli_ok(home, "status", "--prometheus"))
    }
    assert prom["ledger_policy_mismatch"].samples[0].value == 1


def test_r_diag_1_text_dashboard_fits_100_columns(scene: Scene, home: Path) -> None:
    cli_ok(home, "cooldown", "set", "beta/free/unknown", "30m")
    text = cli_ok(home, "status")
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    for section in ("routes", "budgets", "cooldowns", "sources", "recent attempts", "store"):
        assert any(line.startswith(f"── {section} ") for line in lines), section
    assert "  fresh source   alpha/small\n" in text
    assert re.search(r"\n  excluded +\S", text)
    assert re.search(r"beta/mid +model_cooldown until 01-15 08:01:00", text)
    assert "6 / 30 used" in text
    assert "1 attempt(s) of unknown cost" in text
    assert "src-retry" in text
    assert scene.results[3].paused is not None
    assert scene.results[3].paused in text
    assert "rate_limit/http_429" in text
    assert len(lines) < 80  # a dashboard, not a dump


def test_r_diag_2_prometheus_parses_with_real_parser(scene: Scene, home: Path) -> None:
    cli_ok(home, "cooldown", "set", "alpha/big", "10m")
    text = cli_ok(home, "status", "--prometheus")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "ledger_hourly_calls_used",
        "ledger_hourly_calls_limit",
        "ledger_daily_estimated_spend_usd",
        "ledger_unknown_cost_attempts",
        "ledger_daily_tokens",
        "ledger_cooldown_remaining_seconds",
        "ledger_sources",
        "ledger_attempts_24h",
    ):
        assert name in families, name
        assert families[name].type == "gauge"
    assert "ledger_daily_ceiling_usd" not in {s.name for f in families.values() for s in f.samples}
    assert families["ledger_hourly_calls_used"].samples[0].value == 6
    assert families["ledger_hourly_calls_limit"].samples[0].value == 30
    tokens = {s.labels["direction"]: s.value for s in families["ledger_daily_tokens"].samples}
    assert tokens == {"input": 100, "output": 50, "cache_write": 0, "cache_read": 0}
    states = {s.labels["state"]: s.value for s in families["ledger_sources"].samples}
    assert states["paused"] == 1
    cool = {s.labels["target"]: s for s in families["ledger_cooldown_remaining_seconds"].samples}
    assert cool["alpha/big"].labels == {
        "scope": "model",
        "target": "alpha/big",
        "provider": "alpha",
        "kind": "manual",
        "origin": "manual",
    }
    assert cool["alpha/big"].value == pytest.approx(600, abs=1)
    attempts = {
        (s.labels["model"], s.labels["status"], s.labels["kind"]): s.value
        for s in families["ledger_attempts_24h"].samples
    }
    assert attempts[("beta/mid", "failed", "rate_limit")] == 1
    assert attempts[("alpha/small", "succeeded", "none")] == 1
    assert text.count("# HELP ") == text.count("# TYPE ")


def test_r_diag_2_prometheus_escapes_label_values(scene: Scene, home: Path) -> None:
    doc = status_json(home)
    nasty = 'we"ird\\model\nkey'
    doc["cooldowns"] = [
        {"scope": "model", "target": "p/" + nasty, "remaining_s": 5.5, "kind": "k", "origin": "o"}
    ]
    families = {f.name: f for f in text_string_to_metric_families(render_prometheus(doc))}
    sample = families["ledger_cooldown_remaining_seconds"].samples[0]
    assert sample.labels["target"] == "p/" + nasty
    assert sample.value == 5.5


def test_status_json_and_prometheus_are_exclusive(home: Path) -> None:
    result = cli(home, "status", "--json", "--prometheus")
    assert result.exit_code == 2


def test_status_on_empty_ledger(home: Path) -> None:
    cli_ok(home, "db", "upgrade")  # a read never creates the database (issue 15 item 5)
    doc = status_json(home)
    assert doc["recent"] == []
    assert doc["sources"]["list"] == []
    assert doc["history"] == []
    assert doc["hourly"]["used"] == 0
    text = cli_ok(home, "status")
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "none active" in text


def test_r_diag_1_long_ids_and_many_rows_stay_in_100_columns(
    home: Path, make_ledger: LedgerFactory, clock: Clock
) -> None:
    write_policy(home, callsPerHour=200, sourceCalls=100)
    led = make_ledger()
    for i in range(60):
        sid = f"{i:03d}-" + "x" * 190
        led.add_source(sid)
        r = led.reserve(sid, "alpha/small")
        led.settle(r.id, Failed(classify_kind("invalid_output", "json_schema")))
        clock.advance(10)
    doc = status_json(home)
    assert len(doc["sources"]["list"]) == 50  # capped
    assert len(doc["recent"]) == 20
    text = cli_ok(home, "status")
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "(50 of 60 shown" in text


def test_r_diag_5_source_show_history(scene: Scene, home: Path, clock: Clock) -> None:
    led = scene.ledger
    first = led.reserve("src-show", "alpha/small", input_bytes=10)
    led.settle(first.id, Failed(classify_kind("invalid_output", "json_schema")))
    fix = led.reserve("src-show", "alpha/small", input_bytes=10, role=AttemptRole.CORRECTION)
    clock.advance(1200)
    led.settle(fix.id, Failed(classify_exception(httpx.ReadTimeout("x"))))
    cli_ok(home, "source", "evolve", "src-show", "--model", "beta/mid")
    doc = json.loads(cli_ok(home, "source", "show", "src-show", "--json"))
    assert doc["calls"] == 3
    assert doc["correction_used"] is True
    assert doc["correction_reason"] == "json_schema"
    assert doc["retry_at"] is not None
    assert doc["backoff_steps"] == 1
    assert doc["output_failures"] == 1
    assert doc["failures"] == 2
    assert doc["models"] == ["alpha/small", "beta/mid"]
    rows = [
        (a["model"], a["kind"], a["subkind"], a["correction"], a["override"], a["fallback"])
        for a in doc["attempts"]
    ]
    assert rows == [
        ("alpha/small", "invalid_output", "reported", False, False, False),
        ("alpha/small", "transport", "timeout", True, False, False),
        ("beta/mid", None, None, False, True, False),
    ]
    assert doc["attempts"][1]["duration_ms"] == 1200
    assert all(a["created"].endswith("Z") for a in doc["attempts"])
    text = cli_ok(home, "source", "show", "src-show")
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "correction used (json_schema)" in text
    assert any("transport/timeout" in ln and ln.rstrip().endswith("correction") for ln in lines)
    assert any(ln.rstrip().endswith("override") for ln in lines)
    fb = json.loads(cli_ok(home, "source", "show", "src-fb", "--json"))
    assert [a["fallback"] for a in fb["attempts"]] == [False, True]
    assert fb["attempts"][1]["fallback_from"] == "beta/mid"
    assert fb["state"] == "done"
    assert fb["finished"] is not None
    paused = cli_ok(home, "source", "show", LONG_ID)
    assert f"paused: {scene.results[3].paused}" in paused
    assert max(len(line) for line in paused.splitlines()) <= 100


def test_r_diag_5_open_past_deadline_shows_expired(scene: Scene, home: Path, clock: Clock) -> None:
    clock.advance(3 * 3_600_000)
    scene.ledger.add_source("tick")  # a write moves the ledger's time forward
    doc = json.loads(cli_ok(home, "source", "show", "src-open", "--json"))
    assert doc["attempts"][0]["status"] == "expired"
    assert status_json(home)["recent"][0]["status"] == "expired"


def test_source_show_unknown_source(home: Path) -> None:
    assert cli(home, "source", "show", "nope").exit_code != 0


def _plans(led: Ledger) -> list[tuple[str, list[str]]]:
    """Run status_data and EXPLAIN QUERY PLAN every statement it sent that reads reservations."""
    statements: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool) -> None:
        if "reservations" in sql and sql.lstrip().upper().startswith("SELECT"):
            statements.append((sql, params))

    event.listen(led.db.engine, "before_cursor_execute", capture)
    try:
        status_data(led.db, led.policy.calls_per_hour)
    finally:
        event.remove(led.db.engine, "before_cursor_execute", capture)
    plans = []
    with led.db.engine.connect() as conn:
        for sql, params in statements:
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params).all()
            plans.append((sql, [str(r[-1]) for r in rows]))
    return plans


def test_issue_7_status_queries_never_scan_reservations(
    scene: Scene, ledger_db: str | None
) -> None:
    if ledger_db is not None:
        pytest.skip("reads SQLite's EXPLAIN QUERY PLAN")
    plans = _plans(scene.ledger)
    assert len(plans) >= 6
    for sql, details in plans:
        for detail in details:
            assert not re.fullmatch(r"SCAN (TABLE )?reservations( AS \w+)?", detail), (sql, details)


def test_status_text_render_is_pure(scene: Scene, home: Path) -> None:
    doc = status_json(home)
    assert render_text(doc) == render_text(json.loads(json.dumps(doc)))


def test_r_db_3a_network_filesystem_warning_in_document(scene: Scene) -> None:
    led = scene.ledger
    data = status_data(led.db, led.policy.calls_per_hour)
    routes = RouteView(routes=("alpha/small",), excluded=())
    doc = status_document(data, led.policy, led.fingerprint, routes, "nfs4")
    assert doc["store"]["network_filesystem"] is not None
    assert "nfs4" in doc["store"]["network_filesystem"]
    assert doc["store"]["network_filesystem"] in doc["warnings"]
    assert "WARNING: the database is on a network filesystem (nfs4)" in render_text(doc)
    clean = status_document(data, led.policy, led.fingerprint, routes, None)
    assert clean["store"]["network_filesystem"] is None
    assert clean["warnings"] == []


def test_issue_22_hours_24_partition_the_daily_window(
    scene: Scene, home: Path, clock: Clock
) -> None:
    """R-SRV-8: the last 24 h per hour (calls, failures by kind, cost) is in the status document,
    read in the same read; the hours add up to the daily totals."""
    led = scene.ledger
    clock.advance(90 * 60 * 1000)  # 1.5 h later: the scene sits in hour 22, this one in hour 23
    late = led.reserve("src-late", "alpha/small", input_bytes=10)
    led.settle(late.id, Failed(classify_http(503, {}, None, clock.ms)))
    doc = status_json(home)
    hours = doc["hours_24"]
    assert len(hours) == 24
    assert hours[-1]["end"] == doc["now"]
    assert [h["start"] for h in hours[1:]] == [h["end"] for h in hours[:-1]]
    daily = doc["daily"]
    assert sum(h["attempts"] for h in hours) == daily["attempts"] == 7
    assert sum(h["spent_usd"] for h in hours) == pytest.approx(daily["spent_usd"])
    assert sum(h["unknown_cost_attempts"] for h in hours) == daily["unknown_cost_attempts"]
    assert hours[22]["attempts"] == 6
    assert hours[22]["succeeded"] == 2
    assert hours[22]["failed"] == {"rate_limit": 1, "safety": 1, "transport": 1}
    assert hours[22]["other"] == 1  # the open reservation
    assert hours[23]["attempts"] == 1
    assert hours[23]["failed"] == {"transport": 1}  # 503: a transport failure
    assert all(h["attempts"] == 0 for h in hours[:22])


def test_issue_22_failovers_name_source_models_and_kind(scene: Scene, home: Path) -> None:
    """R-SRV-8: recent failovers (source, from → to, the kind that caused them)."""
    doc = status_json(home)
    assert [
        (f["source"], f["from"], f["to"], f["kind"], f["status"]) for f in doc["failovers"]
    ] == [("src-fb", "beta/mid", "alpha/small", "rate_limit", "succeeded")]
    assert doc["failovers"][0]["time"].endswith("Z")


def test_issue_22_text_shows_per_hour_line_and_failovers(scene: Scene, home: Path) -> None:
    """The text dashboard renders the same hours and failovers as the JSON and the page."""
    text = cli_ok(home, "status")
    line = next(x for x in text.splitlines() if x.startswith("  calls per hour "))
    assert line.endswith("(24 h, now at the right; peak 6, 3 failed)")
    assert line[17:41] == " " * 23 + "█"
    assert "── failovers (24 h)" in text
    row = next(x for x in text.splitlines() if "beta/mid → alpha/small" in x)
    assert row.split()[2:] == ["src-fb", "beta/mid", "→", "alpha/small", "rate_limit", "succeeded"]


def test_r_diag_2_prometheus_carries_up_and_the_warning_count(home: Path) -> None:
    """Issue 29 item 12: `ledger_up 1` when the ledger was read and `ledger_status_warnings`, the
    count of the document's warnings, so an alert can fire on what the text dashboard warns of."""

    def gauges() -> dict[str, float]:
        text = cli_ok(home, "status", "--prometheus")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        return {n: families[n].samples[0].value for n in ("ledger_up", "ledger_status_warnings")}

    fresh = gauges()  # nothing recorded yet: warned, and counted
    assert fresh == {"ledger_up": 1, "ledger_status_warnings": len(status_json(home)["warnings"])}
    assert fresh["ledger_status_warnings"] >= 1
    cli_ok(home, "db", "upgrade")
    upgraded = gauges()
    assert upgraded["ledger_status_warnings"] == len(status_json(home)["warnings"])
    assert upgraded["ledger_status_warnings"] == fresh["ledger_status_warnings"] - 1
