"""R-POL-4 follow-ups and the privacy boundary at reserve (issue 12 items 6 and 10).

A failed reservation stores which immediate follow-up its decision permitted; `reserve(after=)`
honours exactly that one, never after a follow-up. Reserve applies the selector's privacy boundary
(route rules, crossProviderFallback, fallbackModels) to every request, whatever role it claims.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.api import Ledger
from ledger.classify import classify_http, classify_kind
from ledger.cli.main import cli
from ledger.errors import Refused, UsageError
from ledger.kinds import AttemptRole, ExclusionReason
from ledger.records import Failed, Reservation, SettleResult
from ledger.store import queue as q
from ledger.store import sqlite_driver
from ledger.store.reservations import FOLLOW_UP_GRACE_MS
from tests.support.backends import BACKENDS
from tests.support.ledgers import Clock, LedgerFactory


def refusal(fn: object) -> str:
    with pytest.raises(Refused) as info:
        fn()  # type: ignore[operator]
    return info.value.reason


def fail(
    led: Ledger, res: Reservation, status: int | None = None, kind: str = "unknown"
) -> SettleResult:
    cls = classify_http(status, {}, None, 0) if status else classify_kind(kind)
    return led.settle(res.id, Failed(cls))


def stored_follow_up(led: Ledger, reservation_id: int) -> tuple[Any, Any]:
    path = led.state.db_path
    assert path is not None
    with sqlite_driver.connect(path) as raw:
        row = raw.execute(
            "SELECT follow_up, after_id FROM reservations WHERE id = ?", (reservation_id,)
        ).fetchone()
    return tuple(row)


# --------------------------------------------------------------------------- item 6


@pytest.mark.parametrize(("status", "kind"), [(None, "unknown"), (None, "stale"), (503, "")])
def test_issue12_item6_no_follow_up_after_a_failure_that_permits_none(
    make_ledger: LedgerFactory, status: int | None, kind: str
) -> None:
    led = make_ledger()
    res = led.reserve("s1", "alpha/small")
    settled = fail(led, res, status, kind)  # unknown, stale, a 1st transport failure: no fallback
    assert settled.fallback is None
    assert not settled.use_correction
    assert stored_follow_up(led, res.id) == (None, None)
    for model in ("beta/mid", "alpha/small"):
        assert refusal(lambda m=model: led.reserve("s1", m, after=res.id)) == "source_backoff"


def test_issue12_item6_follow_ups_never_chain(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger(sourceModels=3, sourceCalls=10)
    fail(led, led.reserve("s0", "alpha/small"), 503)  # first strike on the model
    first = led.reserve("s1", "alpha/small")
    settled = fail(led, first, 503)  # second strike: the model cools, a fallback is permitted
    assert settled.fallback == "other_provider"
    assert stored_follow_up(led, first.id) == ("fallback", None)
    backup = led.reserve("s1", "beta/mid", after=first.id)  # the role is the ledger's, not ours
    assert backup.role is AttemptRole.FALLBACK
    assert stored_follow_up(led, backup.id) == (None, first.id)
    second = fail(led, backup, 429)  # a rate limit would permit a fallback, but not after one
    assert second.fallback is None
    assert stored_follow_up(led, backup.id) == (None, first.id)
    for after in (backup.id, first.id):
        assert refusal(lambda a=after: led.reserve("s1", "alpha/big", after=a)) == (
            "source_backoff"
        )


def test_issue12_item6_a_correction_goes_to_the_same_model_a_fallback_to_another(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(sourceModels=3, sourceCalls=10)
    first = led.reserve("s1", "alpha/small")
    settled = fail(led, first, kind="invalid_output")  # 1st output failure: a correction
    assert settled.use_correction
    assert stored_follow_up(led, first.id) == ("correction", None)
    with pytest.raises(UsageError):  # a correction permit is no fallback
        led.reserve(
            "s1", "beta/mid", role=AttemptRole.FALLBACK, fallback_from="beta/mid", after=first.id
        )
    correction = led.reserve("s1", "alpha/small", after=first.id)
    assert correction.role is AttemptRole.CORRECTION
    # a correction's failure (2nd output failure) permits an alternate model, but not at once
    assert fail(led, correction, kind="invalid_output").fallback is None
    third = led.reserve("s1", "alpha/small")  # a fresh item: primary on the same model
    assert third.role is AttemptRole.PRIMARY
    assert fail(led, third, kind="stale").fallback is None  # stale: backoff, no fallback
    assert refusal(lambda: led.reserve("s1", "beta/mid", after=third.id)) == "source_backoff"


def test_issue12_item6_a_fallback_permit_is_not_a_same_model_retry(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(sourceModels=3, sourceCalls=10)
    fail(led, led.reserve("s1", "alpha/small"), kind="invalid_output")  # correction owed
    # the next queue item runs the persisted correction (no `after`), which fails again:
    correction = led.reserve("s1", "alpha/small", role=AttemptRole.CORRECTION)
    assert fail(led, correction, kind="invalid_output").fallback == "alternate_model"
    assert stored_follow_up(led, correction.id) == ("fallback", None)
    with pytest.raises(UsageError):  # a same-model "fallback" is no fallback
        led.reserve(
            "s1",
            "alpha/small",
            role=AttemptRole.FALLBACK,
            fallback_from="alpha/small",
            after=correction.id,
        )
    other = led.reserve("s2", "alpha/small")
    fail(led, other, kind="unknown")
    with pytest.raises(UsageError):  # another source's permit lifts nothing: bad input
        led.reserve("s2", "beta/mid", after=correction.id)
    alternate = led.reserve("s1", "beta/mid", after=correction.id)
    assert alternate.role is AttemptRole.FALLBACK
    assert stored_follow_up(led, alternate.id) == (None, correction.id)


def test_issue12_item6_cli_reserve_after(home: Path) -> None:
    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["--home", str(home), *args])

    assert run("reserve", "s0", "--model", "alpha/small").exit_code == 0  # reservation 1
    assert run("settle", "1", "--http-status", "503").exit_code == 0  # first strike
    assert run("reserve", "s1", "--model", "alpha/small").exit_code == 0  # reservation 2
    assert run("settle", "2", "--http-status", "503").exit_code == 0  # cools: fallback permitted
    plain = run("reserve", "s1", "--model", "beta/mid")
    assert plain.exit_code == 3
    assert "source_backoff" in plain.output
    follow = run("reserve", "s1", "--model", "beta/mid", "--after", "2")
    assert follow.exit_code == 0, follow.output
    assert "(fallback)" in follow.output
    again = run("reserve", "s1", "--model", "gamma/g1", "--after", "2", "--json")
    assert again.exit_code != 0
    bad = run("reserve", "s1", "--model", "beta/mid", "--after", "0")
    assert bad.exit_code == 2


def test_issue12_item6_a_follow_ups_failure_never_says_a_fallback_is_permitted(
    make_ledger: LedgerFactory,
) -> None:
    """`ledger settle` prints the actions applied: after the item's one follow-up, none may
    claim a fallback is permitted next to "no immediate follow-up"."""
    led = make_ledger(sourceModels=3, sourceCalls=10)
    first = led.reserve("s1", "alpha/small")
    assert fail(led, first, 429).fallback is not None
    backup = led.reserve("s1", "beta/mid", after=first.id)
    second = fail(led, backup, 429)
    assert second.fallback is None
    assert not [a for a in second.actions if a.startswith("fallback permitted")], second.actions
    assert "no immediate follow-up: this attempt was the item's one follow-up" in second.actions


def test_issue12_item6_after_naming_no_reservation_of_the_source_is_bad_input(home: Path) -> None:
    """`--after` with a mistyped id, or another source's reservation, is exit 2 and writes
    nothing (it used to be granted silently as a plain primary reservation)."""

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["--home", str(home), *args])

    assert run("reserve", "s0", "--model", "alpha/small").exit_code == 0  # reservation 1
    assert run("settle", "1", "--http-status", "429").exit_code == 0  # permits a fallback
    path = home / "ledger.db"
    with sqlite_driver.connect(path) as raw:
        before = raw.execute("SELECT count(*) FROM reservations").fetchone()
    for source, after in (("s0", "99"), ("s1", "1")):
        result = run("reserve", source, "--model", "beta/mid", "--after", after)
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [
            "ledger: after names no reservation of this source"
        ]
    with sqlite_driver.connect(path) as raw:
        assert raw.execute("SELECT count(*) FROM reservations").fetchone() == before
        assert raw.execute("SELECT count(*) FROM sources WHERE id = 's1'").fetchone() == (0,)


def test_r_diag_5_source_show_says_which_attempt_was_an_immediate_follow_up(home: Path) -> None:
    """`source show` wires the stored permission (`permits`) and the follow-up (`after`)."""

    def run(*args: str) -> Any:
        result = CliRunner().invoke(cli, ["--home", str(home), *args])
        assert result.exit_code == 0, result.output
        return result

    run("reserve", "s1", "--model", "alpha/small")  # reservation 1
    run("settle", "1", "--http-status", "429")  # rate limit: a fallback is permitted
    run("reserve", "s1", "--model", "beta/mid", "--after", "1")  # reservation 2
    run("settle", "2", "--ok")
    doc = json.loads(run("source", "show", "s1", "--json").output)
    first, second = doc["attempts"]
    assert (first["immediate"], first["after"], first["permits"]) == (False, None, "fallback")
    assert (second["immediate"], second["after"], second["permits"]) == (True, 1, None)
    assert (second["fallback"], second["fallback_from"]) == (True, "alpha/small")
    text = run("source", "show", "s1").output.splitlines()
    assert "rate_limit/http_429" in text[-2]
    assert "after" not in text[-2]
    assert text[-1].endswith("  fallback after #1")  # the immediate follow-up of #1


# --------------------------------------------------------------------------- item 10


def test_issue12_item10_route_deny_and_allow_hold_at_reserve(make_ledger: LedgerFactory) -> None:
    led = make_ledger(routes={"deny": ["beta/*"], "allow": ["alpha/*", "beta/*"]})
    assert refusal(lambda: led.reserve("s1", "beta/mid")) == "denied_by_route"
    assert refusal(lambda: led.reserve("s1", "beta/mid", override=True)) == "denied_by_route"
    led.reserve("s1", "alpha/small")
    assert refusal(lambda: led.reserve("s2", "gamma/g1")) == "denied_by_route"  # not allowed
    path = led.state.db_path
    assert path is not None
    with sqlite_driver.connect(path) as raw:  # the refusals wrote nothing
        assert raw.execute("SELECT id FROM sources").fetchall() == [("s1",)]


def test_issue12_item10_fallback_models_is_the_complete_backup_list(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(defaultModel="alpha/small", fallbackModels=["beta/mid"], sourceModels=3)
    assert refusal(lambda: led.reserve("s1", "alpha/big")) == "not_in_fallback_list"
    assert refusal(lambda: led.reserve("s1", "alpha/big", override=True)) == (
        "not_in_fallback_list"
    )
    first = led.reserve("s1", "alpha/small")
    fail(led, first, 400)  # request_rejected: a compatible backup is permitted
    assert refusal(lambda: led.reserve("s1", "beta/free/unknown", after=first.id)) == (
        "not_in_fallback_list"
    )
    assert led.reserve("s1", "beta/mid", after=first.id).role is AttemptRole.FALLBACK


def test_issue12_item10_cross_provider_false_confines_to_the_primary(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(crossProviderFallback=False, sourceCalls=10)
    led.reserve("s1", "beta/mid")  # no defaultModel: the source's first model is its primary
    for model in ("alpha/small", "beta/free/unknown"):
        for override in (False, True):
            assert refusal(lambda m=model, o=override: led.reserve("s1", m, override=o)) == (
                "not_in_fallback_list"
            )
    led.reserve("s1", "beta/mid")
    pinned = make_ledger(crossProviderFallback=False, defaultModel="alpha/small")
    assert refusal(lambda: pinned.reserve("s9", "beta/mid")) == "not_in_fallback_list"
    pinned.reserve("s9", "alpha/small")


def test_issue12_item10_role_and_fallback_from_are_checked(make_ledger: LedgerFactory) -> None:
    led = make_ledger(sourceModels=3)
    with pytest.raises(UsageError):  # a fallback from a model the source never used
        led.reserve("s1", "beta/mid", role=AttemptRole.FALLBACK, fallback_from="alpha/small")
    with pytest.raises(UsageError):
        led.reserve("s1", "beta/mid", role=AttemptRole.FALLBACK)
    with pytest.raises(UsageError):  # a correction repeats a model
        led.reserve("s1", "beta/mid", role=AttemptRole.CORRECTION)
    with pytest.raises(UsageError):
        led.reserve("s1", "beta/mid", fallback_from="alpha/small")
    with pytest.raises(UsageError):
        led.reserve("s1", "beta/mid", role=AttemptRole.OVERRIDE)
    led.reserve("s1", "alpha/small")
    res = led.reserve("s1", "beta/mid", role=AttemptRole.FALLBACK, fallback_from="alpha/small")
    assert res.role is AttemptRole.FALLBACK


POLICIES: list[dict[str, Any]] = [
    {"routes": {"deny": ["alpha/b*"]}},
    {"routes": {"allow": ["beta/*"]}, "defaultModel": "beta/mid"},
    {"defaultModel": "alpha/small", "fallbackModels": ["beta/mid"]},
    {"defaultModel": "alpha/small", "crossProviderFallback": False},
    {"defaultModel": "beta/mid", "fallbackModels": ["alpha/big"], "routes": {"deny": ["*big"]}},
]
BOUNDARY = {ExclusionReason.DENIED_BY_ROUTE, ExclusionReason.NOT_IN_FALLBACK_LIST}


@pytest.mark.parametrize("policy", POLICIES)
def test_issue12_item10_reserve_refuses_exactly_what_select_keeps_out(
    make_ledger: LedgerFactory, policy: dict[str, Any]
) -> None:
    led = make_ledger(**policy, callsPerHour=100, sourceModels=5)
    selection = led.select("fresh", after_failure=None)
    out = {e.model: e.reason for e in selection.excluded if e.reason in BOUNDARY}
    other = {e.model for e in selection.excluded if e.reason not in BOUNDARY}
    assert out, "every policy keeps a model out"
    assert selection.routes, "every policy admits a model"
    for i, model in enumerate(["alpha/small", "alpha/big", "beta/mid", "beta/free/unknown"]):
        if model in other:  # e.g. same_provider: a rule before the boundary, not reserve's
            continue
        if model in out:
            assert refusal(lambda m=model, i=i: led.reserve(f"p{i}", m, override=True)) == (
                out[model].value
            )
        else:
            led.reserve(f"p{i}", model, override=True)


# --------------------------------------------------------------------------- issue 20 item 3


@pytest.mark.parametrize(("status", "kind"), [(429, ""), (401, ""), (None, "invalid_output")])
def test_issue20_item3_r_res_9_a_failed_override_permits_no_follow_up(
    make_ledger: LedgerFactory, status: int | None, kind: str
) -> None:
    led = make_ledger(sourceModels=3, sourceCalls=10)
    fail(led, led.reserve("s1", "beta/mid"))  # unknown: the source backs off
    assert refusal(lambda: led.reserve("s1", "alpha/small")) == "source_backoff"
    override = led.evolve("s1", "alpha/small")
    settled = fail(led, override, status, kind)  # in a queue item this would permit a follow-up
    assert settled.fallback is None
    assert not any(a.startswith("fallback permitted") for a in settled.actions)
    assert "no immediate follow-up: an override is one explicit attempt" in settled.actions
    assert stored_follow_up(led, override.id) == (None, None)
    for model in ("beta/mid", "alpha/small", "alpha/big"):
        assert refusal(lambda m=model: led.reserve("s1", m, after=override.id)) == (
            "source_backoff"
        )


def _long_backoff_ahead(led: Ledger, clock: Clock) -> None:
    """s1 with three earlier failures (overrides): its next backoff is 1 h."""
    led.add_source("s1", "payload")  # an override is for a known source
    for _ in range(3):  # 1, 5, 15 min of backoff
        fail(led, led.evolve("s1", "beta/mid"))
    clock.advance(15 * 60_000 * 2)


def _failed_with_a_fallback(led: Ledger) -> Reservation:
    """A reservation of s1 on alpha/small whose transport failure cooled the model, permitted a
    fallback and set the 1 h backoff."""
    fail(led, led.reserve("s0", "alpha/small"), 503)  # first strike on the model
    first = led.reserve("s1", "alpha/small")
    assert fail(led, first, 503).fallback == "other_provider"  # second strike
    return first


@pytest.mark.parametrize(
    ("after_deadline_ms", "granted"),
    [(-1, True), (FOLLOW_UP_GRACE_MS, True), (FOLLOW_UP_GRACE_MS + 1, False), (50 * 60_000, False)],
)
@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_issue20_item3_after_is_honoured_until_the_deadline_plus_a_short_grace(
    make_ledger: LedgerFactory, clock: Clock, after_deadline_ms: int, granted: bool
) -> None:
    led = make_ledger(sourceModels=3, sourceCalls=10, timeoutMs=5_000)
    _long_backoff_ahead(led, clock)
    first = _failed_with_a_fallback(led)
    clock.ms = first.deadline_ms + after_deadline_ms
    if granted:
        assert led.reserve("s1", "beta/mid", after=first.id).role is AttemptRole.FALLBACK
    else:  # 50 minutes later, inside the 1 h backoff: refused like any plain reserve
        assert refusal(lambda: led.reserve("s1", "beta/mid", after=first.id)) == (
            "source_backoff"
        )


@pytest.mark.parametrize("released", [False, True])
@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_issue20_item3_after_is_honoured_only_in_the_failed_reservations_queue_item(
    make_ledger: LedgerFactory, clock: Clock, released: bool
) -> None:
    led = make_ledger(sourceModels=3, sourceCalls=10)
    led.add_source("s1", None)
    _long_backoff_ahead(led, clock)
    assert q.claim(led.db, "w", led.policy.lease_ms) is not None
    first = _failed_with_a_fallback(led)
    clock.advance(1)
    if released:  # the item ended without its follow-up; a later one (or a script) asks for it
        q.release(led.db, "s1", "w")
        clock.advance(1)
        assert q.claim(led.db, "w2", led.policy.lease_ms) is None  # backing off
        assert refusal(lambda: led.reserve("s1", "beta/mid", after=first.id)) == (
            "source_backoff"
        )
    else:  # still its own item: the one permitted fallback
        assert led.reserve("s1", "beta/mid", after=first.id).role is AttemptRole.FALLBACK
