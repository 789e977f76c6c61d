"""R-TOK-2, R-TOK-3, R-DB-2: a day's token window read from hour totals and a minute's read
from second totals are exactly the rows' own sums.

Reserve adds a grant's token estimate to its hour's token_hours row and its second's
token_seconds row (per model and provider) and to its scopes' scope_cost_hours and
scope_token_seconds rows; settle adds what the usage changes and marks an overrun's settle time
(`overrun_ms`), all in their write transactions; second rows are kept two minutes. These tests
check, for random histories of grants, successes, failures and cancellations with usage below and
above the estimates (prompt-cache tokens included), that the totals equal the rows and that every
day and minute window a reserve reads (a model's, a provider's, a glob's, a scope's; all tokens,
input, output) equals the plain definition computed from the rows: usage once settled (else the
estimate) of the grants inside the window, plus the usage above the estimate of grants before it
settled inside it. A fixed history runs on both backends; the property on SQLite.
"""

from __future__ import annotations

import random
from contextlib import suppress
from fnmatch import fnmatchcase
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect, select, text

from ledger.api import Ledger
from ledger.budgets.unit import Dimension, Measure, UsageKey, Window
from ledger.catalog import Catalog
from ledger.classify import classify_kind
from ledger.config import Policy
from ledger.errors import NotFoundError, UsageError
from ledger.records import Cancelled, Failed, Success
from ledger.store import migrate, reads, usage
from ledger.store.compact import compact
from ledger.store.costs import MINUTES_KEPT_MS, SECONDS_KEPT_MS, token_parts
from ledger.store.schema import (
    reservation_scopes,
    reservations,
    scope_cost_hours,
    scope_token_minutes,
    scope_token_seconds,
    token_hours,
    token_minutes,
    token_seconds,
)
from tests.support.backends import BACKENDS
from tests.support.ledgers import T0, TEST_CATALOG, Clock, LedgerFactory
from tests.support.scratch import scratch_ledger

SECOND, MINUTE, HOUR, DAY = 1000, 60_000, 3_600_000, 86_400_000
CATALOG = Catalog.model_validate(TEST_CATALOG)
MODELS = ("alpha/small", "alpha/big", "beta/mid", "gamma/g1")
SCOPES = ("night", "team")
POLICY: dict[str, Any] = {
    "callsPerHour": 10**6,
    "sourceCalls": 10**6,
    "sourceTimeMs": 10**12,
    "timeoutMs": 60_000,
    "replyTokens": 100,
    "scopes": {name: {} for name in SCOPES},
}
TARGETS: tuple[tuple[Dimension, str], ...] = (
    (Dimension.MODEL, "alpha/small"),
    (Dimension.MODEL, "beta/mid"),
    (Dimension.PROVIDER, "alpha"),
    (Dimension.PROVIDER, "gamma"),
    (Dimension.GLOB, "alpha/*"),
    (Dimension.GLOB, "*/g?"),
    (Dimension.SCOPE, "night"),
    (Dimension.SCOPE, "team"),
)
KEYS: list[UsageKey] = [
    (window, measure, dim, target)
    for window in (Window.ROLLING_DAY, Window.ROLLING_MINUTE)
    for measure in (Measure.TOKENS, Measure.INPUT_TOKENS, Measure.OUTPUT_TOKENS)
    for dim, target in TARGETS
]
LENGTHS = {Window.ROLLING_DAY: DAY, Window.ROLLING_MINUTE: MINUTE}


def _rows(led: Ledger) -> tuple[list[Any], dict[int, set[str]]]:
    with led.db.read() as conn:
        rows = list(conn.execute(select(reservations)))
        under: dict[int, set[str]] = {}
        for rid, scope in conn.execute(
            select(reservation_scopes.c.reservation_id, reservation_scopes.c.scope)
        ):
            under.setdefault(int(rid), set()).add(str(scope))
    return rows, under


def _part(row: Any, measure: Measure) -> tuple[int, int]:
    """(counted, estimate) of one row for a measure."""
    m = row._mapping
    inp, out = token_parts(m.get)
    est = (int(m["estimate_input_tokens"]), int(m["estimate_output_tokens"]))
    if measure is Measure.INPUT_TOKENS:
        return inp, est[0]
    if measure is Measure.OUTPUT_TOKENS:
        return out, est[1]
    return inp + out, est[0] + est[1]


def _holds(row: Any, under: dict[int, set[str]], dim: Dimension, target: str) -> bool:
    if dim is Dimension.MODEL:
        return bool(row.model_key == target)
    if dim is Dimension.PROVIDER:
        return bool(row.provider == target)
    if dim is Dimension.GLOB:
        return fnmatchcase(row.model_key, target)
    return target in under.get(int(row.id), set())


def plain(led: Ledger, now: int) -> list[int]:
    """The definition, from the rows: grants inside (now - length, now] count their usage (else
    their estimate); grants of the day before that count their usage above the estimate if they
    settled inside the window."""
    rows, under = _rows(led)
    out = []
    for window, measure, dim, target in KEYS:
        since = now - LENGTHS[window]
        total = 0
        for row in rows:
            if not _holds(row, under, dim, target):
                continue
            counted, estimate = _part(row, measure)
            if row.created_ms > since:
                total += counted
            elif row.created_ms > since - DAY and since < (row.settled_ms or 0) <= now:
                total += max(0, counted - estimate)
        out.append(total)
    return out


def read(led: Ledger, now: int) -> list[int]:
    """What a reserve reads (usage.plan)."""
    with led.db.read() as conn:
        planned = usage.plan(now, KEYS, conn.dialect.name)
        assert planned is not None
        return [int(v) for v in conn.execute(*planned).one()]


Totals = dict[Any, tuple[int, int]]


def _nonzero(table: Totals) -> Totals:
    return {k: v for k, v in table.items() if v != (0, 0)}


Tables = tuple[Totals, Totals, Totals, Totals, Totals, Totals]
KEPT = ((SECOND, SECONDS_KEPT_MS), (MINUTE, MINUTES_KEPT_MS))
"""The kept totals after the hours': (step, how long kept) of seconds and of minutes."""


def totals(led: Ledger) -> Tables:
    """(token_hours, scope_cost_hours' tokens, token_seconds, scope_token_seconds,
    token_minutes, scope_token_minutes) as stored, rows of zero left out."""
    with led.db.read() as conn:
        models = {
            (int(h), str(m), str(p)): (int(i), int(o))
            for h, m, p, i, o in conn.execute(select(token_hours))
        }
        sch = scope_cost_hours.c
        scoped = {
            (int(h), str(s)): (int(i), int(o))
            for s, h, i, o in conn.execute(
                select(sch.scope, sch.hour_start_ms, sch.input_tokens, sch.output_tokens)
            )
        }
        kept: list[Totals] = []
        for per_model, per_scope in ((token_seconds, scope_token_seconds),
                                     (token_minutes, scope_token_minutes)):  # fmt: skip
            kept.append({
                (int(t), str(m), str(p)): (int(i), int(o))
                for t, m, p, i, o in conn.execute(select(per_model))
            })  # fmt: skip
            rows = conn.execute(select(per_scope))
            kept.append({(int(t), str(s)): (int(i), int(o)) for s, t, i, o in rows})
    return (_nonzero(models), _nonzero(scoped), *(_nonzero(t) for t in kept))  # type: ignore[return-value]


def totals_from_rows(led: Ledger) -> Tables:
    rows, under = _rows(led)
    tables: Tables = ({}, {}, {}, {}, {}, {})
    for row in rows:
        created = int(row.created_ms)
        inp, out = token_parts(row._mapping.get)
        keys: list[tuple[Totals, tuple[Any, ...]]] = []
        for n, step in enumerate((HOUR, SECOND, MINUTE)):
            at = created - created % step
            keys.append((tables[2 * n], (at, row.model_key, row.provider)))
            keys += [(tables[2 * n + 1], (at, s)) for s in under.get(int(row.id), ())]
        for table, key in keys:
            i, o = table.get(key, (0, 0))
            table[key] = (i + inp, o + out)
    return tuple(_nonzero(t) for t in tables)  # type: ignore[return-value]


def assert_totals(led: Ledger, newest: int) -> None:
    """Hour totals equal the rows. Every second (minute) row kept equals its rows, and every
    second of the two minutes (minute of the 25 hours) before the newest time that has grants is
    kept (older ones may be deleted)."""
    stored, expected = totals(led), totals_from_rows(led)
    assert stored[:2] == expected[:2]
    for n, (step, kept_ms) in enumerate(KEPT):
        kept = newest - newest % step - kept_ms
        for got, want in zip(stored[2 + 2 * n : 4 + 2 * n], expected[2 + 2 * n : 4 + 2 * n],
                             strict=True):  # fmt: skip
            assert got == {k: want[k] for k in got}
            assert {k for k in want if k[0] >= kept} <= set(got)


def overruns_marked(led: Ledger) -> None:
    """`overrun_ms` is the settle time exactly when the usage went above an estimate."""
    rows, _ = _rows(led)
    for row in rows:
        inp, out = token_parts(row._mapping.get)
        over = inp > row.estimate_input_tokens or out > row.estimate_output_tokens
        expected = row.settled_ms if over and row.settled_ms is not None else None
        assert row.overrun_ms == expected, row


def assert_exact(led: Ledger, now: int) -> None:
    assert read(led, now) == plain(led, now)


Op = tuple[str, int, int, int, int]
STEPS = (
    1, 999, SECOND, SECOND + 1, 59_999, MINUTE, MINUTE + 1, HOUR - 1, HOUR, HOUR + 1, 5 * HOUR,
    DAY - 1, DAY, DAY + 1,
)  # fmt: skip
ops: st.SearchStrategy[Op] = st.one_of(
    st.tuples(
        st.just("clock"), st.sampled_from(STEPS) | st.integers(1, 2 * DAY), st.just(0),
        st.just(0), st.just(0),
    ),
    st.tuples(
        st.just("reserve"), st.integers(0, len(MODELS) - 1), st.integers(0, 3000),
        st.integers(0, 3), st.just(0),
    ),
    st.tuples(
        st.just("success"), st.integers(0, 99), st.integers(0, 3000), st.integers(0, 300),
        st.integers(0, 1500),
    ),
    st.tuples(
        st.just("failed"), st.integers(0, 99), st.integers(0, 3000), st.just(0), st.just(0)
    ),
    st.tuples(
        st.just("cancel"), st.integers(0, 99), st.integers(0, 3000), st.integers(0, 300),
        st.integers(0, 1),
    ),
)  # fmt: skip


def apply(led: Ledger, clock: Clock, op: Op, ids: list[int]) -> None:
    kind, a, b, c, d = op
    if kind == "clock":
        clock.advance(a)
        return
    if kind == "reserve":
        under = tuple(s for bit, s in enumerate(SCOPES) if c >> bit & 1)
        ids.append(led.reserve(f"s{len(ids)}", MODELS[a], input_bytes=b, scopes=under).id)
        return
    if not ids:
        return
    outcome: Success | Failed | Cancelled
    if kind == "success":  # d: prompt-cache reads on top of the input
        outcome = Success(b, c, cache_read_tokens=d or None)
    elif kind == "failed":
        outcome = Failed(classify_kind("unknown"), input_tokens=b, output_tokens=None)
    elif d:  # usage seen before the cut
        outcome = Cancelled(input_tokens=b, output_tokens=c, cache_write_tokens=c)
    else:
        outcome = Cancelled()
    with suppress(UsageError, NotFoundError):  # already settled
        led.settle(ids[a % len(ids)], outcome)


def check_all(led: Ledger, newest: int, offsets: list[int]) -> None:
    assert_totals(led, newest)
    overruns_marked(led)
    for offset in (0, *offsets):
        assert_exact(led, newest + offset)
        assert_hourly_exact(led, newest + offset)
    attempts_equal_rows(led)


def attempts_equal_rows(led: Ledger) -> None:
    """R-RES-1: every hour's cost_hours attempts is COUNT(*) of the reservations created in it
    (hours without one hold none)."""
    rows, _ = _rows(led)
    counted: dict[int, int] = {}
    for row in rows:
        hour = int(row.created_ms) - int(row.created_ms) % HOUR
        counted[hour] = counted.get(hour, 0) + 1
    with led.db.read() as conn:
        stored = conn.execute(text("SELECT hour_start_ms, attempts FROM cost_hours")).all()
    assert {int(h): int(a) for h, a in stored if a} == counted


def assert_hourly_exact(led: Ledger, now: int) -> None:
    """R-RES-1: the rolling hour's count a reserve reads is the reservations created after
    now - 1 h."""
    rows, _ = _rows(led)
    with led.db.read() as conn:
        count = reads.hourly_usage(conn, now, 10**9)[0]
    assert count == sum(1 for row in rows if row.created_ms > now - HOUR), now


@given(
    history=st.lists(ops, max_size=40),
    offsets=st.lists(st.sampled_from(STEPS) | st.integers(1, 2 * DAY), max_size=5),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_r_tok_3_day_windows_from_hour_totals_equal_the_rows_for_random_histories(
    history: list[Op], offsets: list[int]
) -> None:
    clock = Clock(T0 + 1234)
    with scratch_ledger(clock, Policy.model_validate(POLICY)) as led:
        ids: list[int] = []
        newest = clock.ms
        for op in history:
            apply(led, clock, op, ids)
            newest = max(newest, clock.ms)
            assert_exact(led, newest)  # what the next reserve would read
        check_all(led, newest, offsets)


def _fixed_history(seed: int, size: int) -> list[Op]:
    """A reproducible history across two days: grants, settles above and below the estimates."""
    rng = random.Random(seed)
    out: list[Op] = []
    for _ in range(size):
        roll = rng.random()
        if roll < 0.15:
            out.append(("clock", rng.choice((*STEPS, rng.randint(1, 3 * HOUR))), 0, 0, 0))
        elif roll < 0.55:
            out.append(("reserve", rng.randrange(len(MODELS)), rng.randint(0, 3000),
                        rng.randrange(4), 0))  # fmt: skip
        elif roll < 0.8:
            out.append(("success", rng.randrange(99), rng.randint(0, 3000), rng.randint(0, 300),
                        rng.choice((0, 0, 800))))  # fmt: skip
        elif roll < 0.9:
            out.append(("failed", rng.randrange(99), rng.randint(0, 3000), 0, 0))
        else:
            out.append(("cancel", rng.randrange(99), rng.randint(0, 3000), rng.randint(0, 300),
                        rng.randrange(2)))  # fmt: skip
    return out


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_3_day_windows_exact_on_both_backends(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    led = make_ledger(**POLICY)
    ids: list[int] = []
    newest = clock.ms
    for n, op in enumerate(_fixed_history(45, 160)):
        apply(led, clock, op, ids)
        newest = max(newest, clock.ms)
        if n % 20 == 0:
            assert_exact(led, newest)
    check_all(led, newest, [1, HOUR, DAY - 1, DAY, DAY + 1, 2 * DAY])


GRANTS = (
    0, 1, MINUTE - 1, MINUTE, MINUTE + 1, 30 * MINUTE + 7, HOUR - 1, HOUR, HOUR + 1,
    2 * HOUR - 1, 5 * HOUR + 7, DAY - HOUR,
)  # fmt: skip


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_3_day_window_edges_on_hour_and_minute_boundaries(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    """Grants on and beside hour and minute boundaries, the window read a millisecond before, at
    and after each one leaves it: the partial first minute, the whole minutes of the first hour
    and the first whole hour meet exactly."""
    led = make_ledger(**POLICY)
    ids = []
    for n, at in enumerate(GRANTS):
        clock.ms = T0 + at
        under = (SCOPES[n % 2],)
        ids.append(led.reserve(f"e{n}", MODELS[n % 2], input_bytes=300 + n, scopes=under).id)
    clock.ms = T0 + DAY - 1
    for n, rid in enumerate(ids[:4]):  # two settle above their estimates, two below
        led.settle(rid, Success(input_tokens=5000 if n % 2 else 1, output_tokens=2))
    for at in GRANTS:
        for now in (T0 + at + DAY - 1, T0 + at + DAY, T0 + at + DAY + 1):
            assert_exact(led, max(now, clock.ms))
    check_all(led, clock.ms, [1, HOUR, 2 * HOUR, DAY])


SECOND_GRANTS = (0, 1, 999, SECOND, SECOND + 1, 2 * SECOND - 1, 30_000, MINUTE - 1)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_2_minute_window_edges_on_second_boundaries(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    """Grants on and beside second boundaries, the minute window read a millisecond before, at
    and after each one leaves it (the window is (now - 60 s, now]): the partial first second and
    the first whole second meet exactly."""
    led = make_ledger(**POLICY)
    ids = []
    for n, at in enumerate(SECOND_GRANTS):
        clock.ms = T0 + at
        under = (SCOPES[n % 2],)
        ids.append(led.reserve(f"e{n}", MODELS[n % 2], input_bytes=300 + n, scopes=under).id)
    for n, rid in enumerate(ids[:4]):  # two settle above their estimates, two below
        led.settle(rid, Success(input_tokens=5000 if n % 2 else 1, output_tokens=2))
    for at in SECOND_GRANTS:
        for now in (T0 + at + MINUTE - 1, T0 + at + MINUTE, T0 + at + MINUTE + 1):
            assert_exact(led, max(now, clock.ms))
    check_all(led, clock.ms, [1, SECOND, MINUTE, 2 * MINUTE])


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_2_second_totals_older_than_two_minutes_are_deleted_and_never_come_back(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    """The grant that opens a second's row deletes the second rows (the scopes' too) older than
    two minutes; a late settle of a grant whose second was deleted moves no second row (its
    usage above the estimate still counts, at its settle time), and every window stays exact."""
    led = make_ledger(**POLICY)
    old = led.reserve("old", "alpha/small", input_bytes=300, scopes=("night",)).id
    first_second = clock.ms - clock.ms % SECOND
    clock.advance(SECONDS_KEPT_MS + SECOND)
    led.reserve("new", "alpha/big", input_bytes=300, scopes=("team",))
    seconds = totals(led)[2:4]
    assert all(key[0] > first_second for table in seconds for key in table)
    led.settle(old, Success(input_tokens=9000, output_tokens=10))  # 8,000+ above its estimate
    assert totals(led)[2:4] == seconds
    assert_exact(led, clock.ms)
    assert read(led, clock.ms)[KEYS.index((Window.ROLLING_MINUTE, Measure.TOKENS,
                                           Dimension.SCOPE, "night"))] > 8000  # fmt: skip
    check_all(led, clock.ms, [1, MINUTE, 2 * MINUTE])


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_db_5_revision_0016_fills_the_second_and_minute_totals_it_keeps(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    """A ledger of revision 0015 with grants before and inside the two minutes (25 hours) before
    its newest time upgrades to second (minute) totals equal to its rows for that span, and reads
    exactly."""
    led = make_ledger(**POLICY)
    ids = []
    backs = (MINUTES_KEPT_MS + MINUTE, MINUTES_KEPT_MS - 1, DAY + 7, 20 * HOUR, 150_000,
             SECONDS_KEPT_MS, 119_999, MINUTE, 59_999, 1500, 1, 0)  # fmt: skip
    for n, back in enumerate(backs):
        clock.ms = T0 + 2 * DAY - back
        under = tuple(s for bit, s in enumerate(SCOPES) if n >> bit & 1)
        ids.append(led.reserve(f"m{n}", MODELS[n % 3], input_bytes=200 + n, scopes=under).id)
    for rid in ids[::3]:
        led.settle(rid, Success(input_tokens=700, output_tokens=9, cache_read_tokens=5))
    newest = clock.ms
    migrate.downgrade(led.db, "0015")
    with led.db.engine.connect() as conn:
        names = inspect(conn).get_table_names()
        assert "token_seconds" not in names
        assert "scope_token_seconds" not in names
    migrate.upgrade(led.db)
    assert_totals(led, newest)
    assert totals(led)[2]  # the recent grants' seconds were filled
    assert len(totals(led)[4]) > len(totals(led)[2])  # and the minutes of the day before
    for offset in (0, 1, 999, SECOND, MINUTE - 1, MINUTE, MINUTE + 1, HOUR, DAY - 1, DAY):
        assert_exact(led, newest + offset)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_db_5_revision_0015_fills_the_token_totals_from_the_rows(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    """A ledger of revision 0014 with history (this one downgraded to it: the totals and the
    overrun marks gone) upgrades to totals and marks equal to its rows, and reads exactly."""
    led = make_ledger(**POLICY)
    ids: list[int] = []
    for op in _fixed_history(7, 120):
        apply(led, clock, op, ids)
    newest = clock.ms
    expected = totals_from_rows(led)
    assert any(row.overrun_ms is not None for row in _rows(led)[0])  # the history has overruns
    migrate.downgrade(led.db, "0014")
    with led.db.engine.connect() as conn:
        columns = conn.execute(text("SELECT * FROM reservations LIMIT 0")).keys()
        assert "overrun_ms" not in columns
        assert "token_hours" not in inspect(conn).get_table_names()
    migrate.upgrade(led.db)
    assert totals(led)[:2] == expected[:2]
    assert_totals(led, newest)
    overruns_marked(led)
    for offset in (0, 1, HOUR, DAY - 1, DAY, DAY + 1):
        assert_exact(led, newest + offset)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_3_compaction_keeps_an_old_grant_whose_overrun_still_counts(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    """A grant older than the retention cut-off that settled above its estimate inside the last
    day: its usage above the estimate still counts, so compaction keeps it (and folds the rest)."""
    led = make_ledger(**POLICY)
    over = led.reserve("old-over", "alpha/small", input_bytes=300).id
    plain_id = led.reserve("old-plain", "alpha/small", input_bytes=300).id
    clock.advance(DAY + HOUR)  # settled late, far above the estimate
    led.settle(over, Success(input_tokens=9000, output_tokens=10))
    led.settle(plain_id, Success(input_tokens=1, output_tokens=1))
    clock.advance(HOUR)
    before = read(led, clock.ms)
    assert before == plain(led, clock.ms)
    assert before[0] > 0  # alpha/small counts the excess
    compact(led.db, clock.ms, DAY)
    kept = {int(row.id) for row in _rows(led)[0]}
    assert kept == {over}
    assert read(led, clock.ms) == before
    clock.advance(DAY)  # its settle time has left every window: it goes too
    compact(led.db, clock.ms, DAY)
    assert _rows(led)[0] == []
