"""R-DIAG-6 (issue 24 item 4): health per provider and per model in status text, JSON and
Prometheus, read in the same transaction as the cooldowns and counters it is made of."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledger.classify import classify_http, classify_kind
from ledger.clock import iso
from ledger.records import Cancelled, Failed, Success
from ledger.status.document import build_status, render_prometheus, render_text
from tests.support.backends import BACKENDS
from tests.support.ledgers import Clock, LedgerFactory, write_policy
from tests.support.status_cli import cli_ok, status_json

pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)

MIN = 60_000


@pytest.fixture
def health_scene(home: Path, make_ledger: LedgerFactory, clock: Clock) -> dict[str, int]:
    """alpha/small cooling after two transport failures; beta/mid probing after a failed probe;
    gamma/g1 healthy after a success that followed a failure. Returns the times that matter."""
    write_policy(home, defaultModel="alpha/small", callsPerHour=100)
    led = make_ledger()
    times: dict[str, int] = {}
    res = led.reserve("g0", "gamma/g1")
    led.settle(res.id, Failed(classify_kind("unknown")))
    clock.advance(1000)
    res = led.reserve("g1", "gamma/g1")
    led.settle(res.id, Success(input_tokens=1, output_tokens=1))
    times["gamma_ok"] = clock.ms
    res = led.reserve("b0", "beta/mid")
    led.settle(res.id, Failed(classify_http(429, {}, None, clock.ms)))
    clock.advance(MIN)
    probe = led.reserve("b1", "beta/mid")  # the recovery probe, which fails: cooled 2 min
    led.settle(probe.id, Failed(classify_http(429, {}, None, clock.ms)))
    clock.advance(2 * MIN)
    probe = led.reserve("b2", "beta/mid")  # the second probe, still in flight
    times["beta_probe_deadline"] = probe.deadline_ms
    cancelled = led.reserve("g2", "gamma/g1")
    led.settle(cancelled.id, Cancelled())  # no failure: gamma stays at 0 in a row
    for sid in ("a0", "a1"):
        res = led.reserve(sid, "alpha/small")
        led.settle(res.id, Failed(classify_http(503, {}, None, clock.ms)))
    times["alpha_failed"] = clock.ms
    times["now"] = clock.ms
    return times


def _rows(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(h["scope"], h["target"]): h for h in doc["health"]}


# target, state and failures in a row of every health row of the scene, in the order shown
SCENE_TABLE = [
    ["alpha", "failing", "2"],  # issue 33: not `healthy` beside 2 failures in a row
    ["beta", "failing", "2"],
    ["gamma", "healthy", "0"],
    ["alpha/small", "cooling", "2"],
    ["beta/mid", "probing", "2"],
    ["gamma/g1", "healthy", "0"],
]


def _health_table(text: str) -> list[list[str]]:
    """The rows of the status text's health section, split into words (the header checked)."""
    lines = text[text.index("\n── health ") + 1 :].split("\n── ")[0].splitlines()
    assert lines[1].split() == [
        "target", "state", "fails", "last", "failure", "last", "success", "1h", "failed", "probes"
    ]  # fmt: skip
    return [line.split() for line in lines[2:]]


def test_r_diag_6_health_json_per_provider_and_model(
    health_scene: dict[str, int], home: Path
) -> None:
    rows = _rows(status_json(home))
    alpha = rows["model", "alpha/small"]
    assert alpha["state"] == "cooling"
    assert alpha["cooling_until"] == iso(health_scene["alpha_failed"] + MIN)
    assert (alpha["consecutive_failures"], alpha["last_failure_kind"]) == (2, "transport")
    assert alpha["last_failure_at"] == iso(health_scene["alpha_failed"])
    assert (alpha["last_success_at"], alpha["attempts_1h"], alpha["failures_1h"]) == (None, 2, 2)
    # the model cools, not the provider; its failures in a row make it `failing` (issue 33)
    assert rows["provider", "alpha"]["state"] == "failing"
    assert rows["provider", "alpha"]["consecutive_failures"] == 2
    beta = rows["model", "beta/mid"]
    assert beta["state"] == "probing"
    assert beta["probe_streak"] == 1
    assert beta["probe_until"] == iso(health_scene["beta_probe_deadline"])
    assert (beta["consecutive_failures"], beta["attempts_1h"], beta["failures_1h"]) == (2, 3, 2)
    gamma = rows["model", "gamma/g1"]
    assert gamma["state"] == "healthy"
    assert gamma["consecutive_failures"] == 0  # reset by the success; a cancel is no failure
    assert gamma["last_failure_kind"] == "unknown"
    assert gamma["last_success_at"] == iso(health_scene["gamma_ok"])
    assert (gamma["attempts_1h"], gamma["failures_1h"]) == (3, 1)
    assert list(rows)[:3] == [("provider", "alpha"), ("provider", "beta"), ("provider", "gamma")]


def test_r_diag_6_health_in_text_and_prometheus(
    health_scene: dict[str, int], home: Path
) -> None:
    table = _health_table(cli_ok(home, "status"))
    assert [row[:3] for row in table] == SCENE_TABLE
    beta = table[4]
    assert (beta[3], beta[-1]) == ("rate_limit", "1")  # last failure kind, failed-probe streak
    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(cli_ok(home, "status", "--prometheus"))
        for s in family.samples
    }
    key = (("scope", "model"), ("state", "cooling"), ("target", "alpha/small"))
    assert metrics["ledger_health_state", key] == 1
    key = (("scope", "model"), ("state", "healthy"), ("target", "alpha/small"))
    assert metrics["ledger_health_state", key] == 0
    target = (("scope", "model"), ("target", "beta/mid"))
    assert metrics["ledger_health_probe_streak", target] == 1
    assert metrics["ledger_health_consecutive_failures", target] == 2
    assert metrics["ledger_health_attempts_1h", target] == 3
    assert metrics["ledger_health_failures_1h", target] == 2
    gamma = (("scope", "model"), ("target", "gamma/g1"))
    assert metrics["ledger_health_last_success_timestamp_seconds", gamma] == pytest.approx(
        health_scene["gamma_ok"] / 1000
    )


def test_r_diag_6_health_is_read_in_the_status_transaction(
    health_scene: dict[str, int], make_ledger: LedgerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Health is read in the same transaction as the cooldowns, probes and counters it is made
    of (status reads its scans of the 24 h window in snapshots of their own: issue 46)."""
    from ledger.store import status_views

    led = make_ledger(defaultModel="alpha/small", callsPerHour=100)
    opened: list[int] = []
    seen: dict[str, int] = {}
    real_read = type(led.db).read

    def counting_read(self: Any, **kwargs: Any) -> Any:
        opened.append(1)
        return real_read(self, **kwargs)

    def noting(name: str) -> Any:
        real = getattr(status_views, name)

        def noted(*args: Any, **kwargs: Any) -> Any:
            seen[name] = len(opened)
            return real(*args, **kwargs)

        return noted

    monkeypatch.setattr(type(led.db), "read", counting_read)
    for name in ("active_cooldowns", "probe_states", "health_counters", "hour_counts"):
        monkeypatch.setattr(status_views, name, noting(name))

    data = status_views.status_data(led.db, 100)
    assert set(seen.values()) == {1}  # health's inputs, in the first read transaction
    assert {(h.scope.value, h.target) for h in data.health} >= {("model", "beta/mid")}
    doc = build_status(led)
    assert [row[:3] for row in _health_table(render_text(doc))] == SCENE_TABLE
    states = {
        (s.labels["target"], s.labels["state"]): s.value
        for family in text_string_to_metric_families(render_prometheus(doc))
        for s in family.samples
        if s.name == "ledger_health_state" and s.labels["scope"] == "model"
    }
    assert {key for key, value in states.items() if value == 1} == {
        ("alpha/small", "cooling"),
        ("beta/mid", "probing"),
        ("gamma/g1", "healthy"),
    }


def test_r_diag_6_a_later_failure_kind_replaces_last_failure_kind(
    make_ledger: LedgerFactory, clock: Clock, home: Path
) -> None:
    """Issue 29 item 19: the last failure's kind is the latest one, on the model and provider."""
    led = make_ledger()
    res = led.reserve("s0", "gamma/g1")
    led.settle(res.id, Failed(classify_kind("unknown")))
    clock.advance(1000)
    res = led.reserve("s1", "gamma/g1")
    led.settle(res.id, Failed(classify_http(503, {}, None, clock.ms)))  # a first strike: no cool
    rows = _rows(build_status(led))
    for key in (("model", "gamma/g1"), ("provider", "gamma")):
        assert (rows[key]["last_failure_kind"], rows[key]["consecutive_failures"]) == (
            "transport",
            2,
        )
        assert rows[key]["last_failure_at"] == iso(clock.ms)


def test_r_diag_6_a_dead_probes_past_deadline_is_not_shown_as_probe_until(
    make_ledger: LedgerFactory, clock: Clock, home: Path
) -> None:
    """Issue 29 item 19: a probe whose worker died frees the target at its deadline; health
    then shows the target probing with no probe in flight."""
    led = make_ledger(timeoutMs=30_000)
    res = led.reserve("b0", "beta/mid")
    led.settle(res.id, Failed(classify_http(429, {}, None, clock.ms)))
    clock.advance(MIN)
    probe = led.reserve("b1", "beta/mid")
    clock.ms = probe.deadline_ms - 1
    beta = _rows(build_status(led))["model", "beta/mid"]
    assert (beta["state"], beta["probe_until"]) == ("probing", iso(probe.deadline_ms))
    clock.ms = probe.deadline_ms + 1
    beta = _rows(build_status(led))["model", "beta/mid"]
    assert (beta["state"], beta["probe_until"]) == ("probing", None)


def test_r_diag_6_issue33_failures_in_a_row_are_never_shown_as_healthy(
    make_ledger: LedgerFactory, clock: Clock, home: Path
) -> None:
    """Issue 33: `healthy` beside "3 failures in a row" contradicted itself. A target that is
    neither cooling nor probing but failed since its last success is `failing`, in the status
    JSON, the text, Prometheus and the page; a success makes it `healthy` again."""
    led = make_ledger()
    for n in range(3):  # unknown failures: counted, no cooldown on gamma or gamma/g1
        res = led.reserve(f"s{n}", "gamma/g1")
        led.settle(res.id, Failed(classify_kind("unknown")))
        clock.advance(1000)
    rows = _rows(status_json(home))
    for key in (("provider", "gamma"), ("model", "gamma/g1")):
        assert (rows[key]["state"], rows[key]["consecutive_failures"]) == ("failing", 3)
    table = _health_table(cli_ok(home, "status"))
    assert [row[:3] for row in table] == [["gamma", "failing", "3"], ["gamma/g1", "failing", "3"]]
    page = home / "status.html"
    cli_ok(home, "status", "--html", str(page))
    html = page.read_text()
    assert '<span class="tag state failing">failing</span>' in html
    assert '<span class="tag state healthy">' not in html
    failing = {
        s.labels["target"]
        for family in text_string_to_metric_families(cli_ok(home, "status", "--prometheus"))
        for s in family.samples
        if s.name == "ledger_health_state" and s.labels["state"] == "failing" and s.value == 1
    }
    assert failing == {"gamma", "gamma/g1"}
    res = led.reserve("ok", "gamma/g1")
    led.settle(res.id, Success(input_tokens=1, output_tokens=1))
    rows = _rows(status_json(home))
    gamma = rows["model", "gamma/g1"]
    assert (gamma["state"], gamma["consecutive_failures"]) == ("healthy", 0)
