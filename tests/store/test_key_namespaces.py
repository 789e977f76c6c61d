"""R-SC-3a in the store, on SQLite and PostgreSQL: a gateway key's request ids are a namespace of
its own (one key can neither learn nor block another's; everyone else shares the default one),
and a key reserves only on a source wholly inside its scopes or on a new one, made under them, in
the reserve's own write transaction: two keys racing to make one new source never both get it."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.errors import Refused, SourceScopeMismatch, UsageError
from ledger.records import Reservation
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import TEST_CATALOG, LedgerFactory
from tests.support.procs import BarrierLike, QueueLike, write_home

MODEL = "alpha/small"
POLICY: dict[str, Any] = {
    "callsPerHour": 1000,
    "scopes": {"a": {"callsPerHour": 100}, "b": {"callsPerHour": 100}, "c": {}},
}


def _reserve(
    led: Ledger, source: str, key: str | None, scopes: tuple[str, ...], request_id: str | None
) -> Reservation:
    """One reserve as the service's gateway makes it: a step of a group commit."""
    step = led.reserve_step(
        source, MODEL, request_id=request_id, scopes=scopes, gateway_key=key
    )
    (answered,) = led.write_steps([step])
    reservation: Reservation = answered.get()
    return reservation


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_3a_each_key_is_a_request_id_namespace_of_its_own(
    make_ledger: LedgerFactory, home: Path, ledger_db: str | None
) -> None:
    led = make_ledger(**POLICY)
    first_a = _reserve(led, "src-a", "alpha", ("a",), "job-1")
    first_b = _reserve(led, "src-b", "beta", ("b",), "job-1")  # not blocked by alpha's id
    assert (first_a.replayed, first_b.replayed) == (False, False)
    assert first_b.id != first_a.id
    assert first_b.source == "src-b"
    again_a = _reserve(led, "src-a", "alpha", ("a",), "job-1")
    assert (again_a.id, again_a.replayed) == (first_a.id, True)  # the same key: the same slot
    again_b = _reserve(led, "src-b", "beta", ("b",), "job-1")
    assert (again_b.id, again_b.replayed) == (first_b.id, True)
    # a key never learns another's reservation: beta naming alpha's id and source is beta's own
    # new request (refused here: alpha's source is not under beta's scopes), never alpha's slot
    with pytest.raises(SourceScopeMismatch):
        _reserve(led, "src-a", "beta", ("b",), "job-1")
    # the default namespace (library, CLI, /v1, socket, service token) is one, apart from keys
    plain = led.reserve("src-plain", MODEL, request_id="job-1")
    assert plain.id not in (first_a.id, first_b.id)
    assert not plain.replayed
    assert led.reserve("src-plain", MODEL, request_id="job-1").id == plain.id
    with pytest.raises(UsageError, match="already used"):  # as before for non-key callers
        led.reserve("src-other", MODEL, request_id="job-1")
    stored = rows(
        db_url(home, ledger_db),
        "SELECT namespace, source_id FROM reservations WHERE request_id = 'job-1'"
        " ORDER BY namespace",
    )
    assert stored == [("", "src-plain"), ("key:alpha", "src-a"), ("key:beta", "src-b")]


def _source_scopes(home: Path, ledger_db: str | None, source: str) -> list[str]:
    found = rows(
        db_url(home, ledger_db),
        "SELECT scope FROM source_scopes WHERE source_id = :s ORDER BY scope",
        s=source,
    )
    return [str(r[0]) for r in found]


def _count(home: Path, ledger_db: str | None, sql: str) -> int:
    ((n,),) = rows(db_url(home, ledger_db), sql)
    return int(n)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_3a_a_key_names_only_a_source_wholly_inside_its_scopes(
    make_ledger: LedgerFactory, home: Path, ledger_db: str | None
) -> None:
    led = make_ledger(**POLICY)
    led.add_source("team-b-src", scopes=["b"])
    led.add_source("team-ab-src", scopes=["a", "b"])
    led.add_source("plain-src")
    for source, scopes in [
        ("team-b-src", ("a",)),  # another team's source
        ("team-ab-src", ("a",)),  # under one of the key's scopes and another one too
        ("plain-src", ("a",)),  # under no scope: only the socket or the service token
        ("plain-src", ("a", "b")),
    ]:
        with pytest.raises(SourceScopeMismatch):
            _reserve(led, source, "alpha", scopes, None)
        with pytest.raises(SourceScopeMismatch):
            _reserve(led, source, "alpha", scopes, "job-x")
    # nothing reserved, nothing written: no reservation, no scope row, the sources as they were
    assert _count(home, ledger_db, "SELECT COUNT(*) FROM reservations") == 0
    assert _count(home, ledger_db, "SELECT COUNT(*) FROM reservation_scopes") == 0
    assert _source_scopes(home, ledger_db, "team-b-src") == ["b"]
    assert _source_scopes(home, ledger_db, "plain-src") == []
    # allowed: every scope of the source among the key's; and any source without a key
    granted = [
        _reserve(led, "team-b-src", "beta", ("b",), None),
        _reserve(led, "team-ab-src", "both", ("a", "b"), None),
        _reserve(led, "team-b-src", "wide", ("a", "b", "c"), None),
        _reserve(led, "plain-src", None, (), None),
        _reserve(led, "team-b-src", None, ("a",), None),
    ]
    assert [r.source for r in granted] == [
        "team-b-src", "team-ab-src", "team-b-src", "plain-src", "team-b-src"
    ]


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_3a_a_keys_new_source_is_made_under_its_scopes_and_only_on_a_grant(
    make_ledger: LedgerFactory, home: Path, ledger_db: str | None
) -> None:
    led = make_ledger(**POLICY)
    made = _reserve(led, "new-src", "both", ("a", "b"), None)
    assert made.source == "new-src"
    assert _source_scopes(home, ledger_db, "new-src") == ["a", "b"]
    _reserve(led, "new-src", "both", ("a", "b"), None)  # its own source again: fine
    with pytest.raises(SourceScopeMismatch):  # a key with only one of them: not its source
        _reserve(led, "new-src", "alpha", ("a",), None)
    # a refused reserve writes nothing: no source, so no scope rows either (R-SC-3a, R-RES-1)
    tight = make_ledger(**{**POLICY, "callsPerHour": 2})
    with pytest.raises(Refused):
        _reserve(tight, "refused-src", "alpha", ("a",), None)
    assert _count(home, ledger_db, "SELECT COUNT(*) FROM sources WHERE id = 'refused-src'") == 0
    assert _source_scopes(home, ledger_db, "refused-src") == []


RACERS = (("alpha", ["a"]), ("beta", ["b"]))
SOURCES = 25


def race_child(
    home: str, db: str | None, key: str, scopes: list[str], barrier: BarrierLike, out: QueueLike
) -> None:
    """Reserve on each shared new source in turn as `key` once both racers are ready; report
    which sources were granted and which refused as outside the key's scopes."""
    granted: list[str] = []
    mismatched: list[str] = []
    errors: list[str] = []
    try:
        led = Ledger.open(home, db, env={})
        barrier.wait(timeout=300)
        for i in range(SOURCES):
            source = f"race-{i}"
            try:
                _reserve(led, source, key, tuple(scopes), None)
                granted.append(source)
            except SourceScopeMismatch:
                mismatched.append(source)
        led.close()
    except Exception as error:  # reported, never swallowed: the parent asserts there are none
        errors.append(f"{type(error).__name__}: {error}")
    out.put({"key": key, "granted": granted, "mismatched": mismatched, "errors": errors})


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_3a_two_keys_racing_to_make_one_new_source_never_both_get_it(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "race"
    write_home(home, TEST_CATALOG, **POLICY)
    Ledger.open(home, ledger_db, env={}).close()  # created before the race
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(RACERS))
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=race_child, args=(str(home), ledger_db, key, scopes, barrier, queue))
        for key, scopes in RACERS
    ]
    for proc in procs:
        proc.start()
    reports = {r["key"]: r for r in (queue.get(timeout=600) for _ in procs)}
    for proc in procs:
        proc.join(60)
    assert [reports[k]["errors"] for k, _ in RACERS] == [[], []]
    winners: dict[str, str] = {}
    for key, _ in RACERS:
        for source in reports[key]["granted"]:
            assert source not in winners, f"both keys were granted {source}"
            winners[source] = key
    assert sorted(winners) == sorted(f"race-{i}" for i in range(SOURCES))  # one each, always
    for key, _ in RACERS:  # the loser of each source was refused, never granted
        assert set(reports[key]["mismatched"]) == {s for s, k in winners.items() if k != key}
    url = db_url(home, ledger_db)
    owned = rows(url, "SELECT source_id, scope FROM source_scopes ORDER BY source_id")
    scopes_of = dict(RACERS)
    assert sorted(owned) == sorted((s, scopes_of[k][0]) for s, k in winners.items())
    spent = rows(
        url,
        "SELECT r.source_id, s.scope FROM reservations r"
        " JOIN reservation_scopes s ON s.reservation_id = r.id",
    )
    assert sorted(spent) == sorted(owned)  # every grant under its own source's scope only
