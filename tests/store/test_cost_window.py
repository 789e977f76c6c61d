"""R-RES-2, R-RES-1, R-DB-2, R-DB-5, R-DB-6: the bucketed rolling 24 h cost is exactly the
plain SUM, and the bucketed rolling hour's count exactly the plain COUNT(*).

`reads.daily_cost` sums the partial first hour of the window row by row and every later hour from
`cost_hours`, which reserve and settle keep equal to SUM(cost_micro) / COUNT(*) of each hour's
reservations inside their write transactions. These tests pin the window edges, the settle
adjustment, compaction, the migration's backfill, and (property) the equality for random
histories, always against the plain SUM over the reservations themselves. The rolling hour's
count (`reads.hourly_usage`, the reserve's shared state) is checked against COUNT(*) at its edges,
and the hours' attempts against the rows they count.
"""

from __future__ import annotations

import multiprocessing
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from ledger.api import Ledger
from ledger.budgets.checks import DailyWindow
from ledger.catalog import Catalog
from ledger.classify import classify_kind
from ledger.config import Policy
from ledger.errors import NotFoundError, Refused, UsageError
from ledger.records import Cancelled, Failed, Success
from ledger.store import Database, migrate, reads, sqlite_driver
from ledger.store.compact import compact
from ledger.store.schema import cost_hours, reservations
from tests.support.backends import BACKENDS
from tests.support.ledgers import T0, TEST_CATALOG, Clock, LedgerFactory
from tests.support.procs import contention_worker, write_home
from tests.support.scratch import scratch_ledger

HOUR, DAY = 3_600_000, 86_400_000
CATALOG = Catalog.model_validate(TEST_CATALOG)
BIG = {"callsPerHour": 10**6, "sourceCalls": 10**6, "sourceTimeMs": 10**12, "timeoutMs": 60_000}
PRICED = ("alpha/small", "alpha/big", "beta/mid", "gamma/g1")
MODELS = (*PRICED, "beta/free/unknown")  # unknown price: cost_micro stays NULL until settled

assert T0 % HOUR == 0  # the edge cases below rely on T0 being an hour boundary


def plain(led: Ledger, now: int) -> int:
    """The reference: SUM over every reservation created in (now - 24 h, now]."""
    with led.db.read() as conn:
        total = conn.execute(
            select(func.coalesce(func.sum(reservations.c.cost_micro), 0)).where(
                reservations.c.created_ms > now - DAY
            )
        ).scalar_one()
    return int(total)


def bucketed(led: Ledger, now: int) -> int:
    """What the reserve path reads."""
    with led.db.read() as conn:
        return reads.daily_cost(conn, now)


def hourly_plain(led: Ledger, now: int) -> int:
    """The reference of the rolling hour (R-RES-1): COUNT(*) of the reservations created after
    now - 1 h, read from the rows."""
    with led.db.read() as conn:
        found = conn.execute(
            select(func.count()).where(reservations.c.created_ms > now - HOUR)
        ).scalar_one()
    return int(found)


def assert_hourly_exact(led: Ledger, now: int) -> None:
    """What reserve and status read of the rolling hour == COUNT(*) over the rows."""
    with led.db.read() as conn:
        count = reads.hourly_usage(conn, now, 10**9)[0]
    assert count == hourly_plain(led, now), now


def hours_table(led: Ledger) -> dict[int, tuple[int, int]]:
    """cost_hours as {hour: (cost, attempts)}."""
    with led.db.read() as conn:
        rows = conn.execute(select(cost_hours)).all()
    return {int(h): (int(c), int(a)) for h, c, a in rows}


def hours_from_rows(led: Ledger) -> dict[int, tuple[int, int]]:
    """The same totals computed from the reservations (NULL cost counted as 0)."""
    out: dict[int, tuple[int, int]] = {}
    with led.db.read() as conn:
        for created, cost in conn.execute(
            select(reservations.c.created_ms, reservations.c.cost_micro)
        ):
            hour = int(created) - int(created) % HOUR
            c, a = out.get(hour, (0, 0))
            out[hour] = (c + int(cost or 0), a + 1)
    return out


def assert_exact(led: Ledger, now: int) -> int:
    """Bucketed == plain at `now`; returns the value."""
    got = bucketed(led, now)
    assert got == plain(led, now), now
    return got


# --- window edges (R-RES-2: a reservation counts while created_ms > now - 24 h) ----------------

EDGES = [
    # (case, created at, query at, counted)
    ("on_boundary_full_hour_of_window", T0, T0 + 23 * HOUR, True),
    ("on_boundary_last_ms_of_window", T0, T0 + DAY - 1, True),
    ("on_boundary_exactly_24h_old", T0, T0 + DAY, False),
    ("before_boundary_in_partial_hour", T0 - 1, T0 + DAY - 2, True),
    ("before_boundary_exactly_24h_old", T0 - 1, T0 + DAY - 1, False),
    ("after_boundary_window_starts_on_boundary", T0 + 1, T0 + DAY, True),
    ("after_boundary_exactly_24h_old", T0 + 1, T0 + DAY + 1, False),
    ("mid_hour_in_partial_hour", T0 + HOUR // 2, T0 + DAY + HOUR // 2 - 1, True),
    ("mid_hour_exactly_24h_old", T0 + HOUR // 2, T0 + DAY + HOUR // 2, False),
    ("same_ms_as_now", T0 + 7, T0 + 7, True),
]


@pytest.mark.parametrize(
    ("created", "query", "counted"),
    [pytest.param(c, q, k, id=name) for name, c, q, k in EDGES],
)
def test_r_res_2_window_edges(
    make_ledger: LedgerFactory, clock: Clock, created: int, query: int, counted: bool
) -> None:
    led = make_ledger(**BIG)
    for before in (DAY + HOUR, DAY + 1, DAY):  # just outside the queried window, in buckets
        clock.ms = query - before
        led.reserve(f"early{before}", "alpha/small", input_bytes=10)
    clock.ms = created
    res = led.reserve("edge", "alpha/small", input_bytes=1000)
    assert res.created_ms == created
    clock.ms = query
    expected_cost = (res.estimate_micro or 0) if counted else 0
    assert assert_exact(led, query) == expected_cost


def test_r_res_2_refusal_uses_the_exact_sum_at_the_edge(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    # alpha/small, 1000 bytes, reply 4096 tokens: 1000 x 1 + 4096 x 2 = 9192 micro-USD
    led = make_ledger(**BIG, dailyEstimatedUsd=0.02)
    clock.ms = T0 - 1
    led.reserve("a", "alpha/small", input_bytes=1000)
    clock.ms = T0
    led.reserve("b", "alpha/small", input_bytes=1000)
    clock.ms = T0 + DAY - 2  # both count: 18384 + 9192 > 20000
    with pytest.raises(Refused) as info:
        led.reserve("c", "alpha/small", input_bytes=1000)
    assert (info.value.reason, info.value.retry_at_ms) == ("daily_cost_ceiling", T0 - 1 + DAY)
    clock.ms = T0 + DAY - 1  # the one at T0 - 1 is exactly 24 h old: out
    led.reserve("c", "alpha/small", input_bytes=1000)


# --- settle moves the hour's total (R-RES-2: actual cost replaces the estimate) ------------


@pytest.mark.parametrize(
    ("created", "settled", "query"),
    [
        pytest.param(T0 + HOUR // 2, T0 + HOUR // 2 + 10, T0 + 5 * HOUR, id="same_hour"),
        pytest.param(T0 + HOUR - 1, T0 + HOUR + 5, T0 + HOUR + 5, id="settled_next_hour"),
        pytest.param(T0 + HOUR // 2, T0 + 5 * HOUR, T0 + 5 * HOUR, id="full_bucket_of_window"),
        pytest.param(
            T0 + HOUR // 2, T0 + DAY + 10 * 60_000, T0 + DAY + 10 * 60_000, id="partial_hour"
        ),
    ],
)
@pytest.mark.parametrize(
    "outcome",
    [
        pytest.param(Success(cost_usd=0.5), id="dearer"),
        pytest.param(Success(100, 10), id="cheaper"),
        pytest.param(Success(), id="no_usage_keeps_estimate"),
        pytest.param(Cancelled(), id="cancelled_keeps_estimate"),
        pytest.param(Failed(classify_kind("unknown"), input_tokens=7, output_tokens=0), id="fail"),
    ],
)
def test_r_res_2_settle_moves_the_cost_of_the_creation_hour(
    make_ledger: LedgerFactory,
    clock: Clock,
    created: int,
    settled: int,
    query: int,
    outcome: Success | Cancelled | Failed,
) -> None:
    led = make_ledger(**BIG)
    clock.ms = created
    other = led.reserve("other", "beta/mid", input_bytes=500)
    res = led.reserve("s", "alpha/small", input_bytes=1000)
    clock.ms = settled
    result = led.settle(res.id, outcome)
    hour = created - created % HOUR
    assert hours_table(led) == hours_from_rows(led)
    assert hours_table(led)[hour] == ((result.cost_micro or 0) + (other.estimate_micro or 0), 2)
    assert bucketed(led, query) == (result.cost_micro or 0) + (other.estimate_micro or 0)
    for at in (query, created + DAY - 1, created + DAY, hour + DAY, hour + DAY - 1):
        assert_exact(led, at)


def test_r_res_2_unknown_price_cost_counts_once_known(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(**BIG)
    res = led.reserve("s", "beta/free/unknown", input_bytes=10)
    assert res.estimate_micro is None
    assert hours_table(led) == {T0: (0, 1)}
    led.settle(res.id, Success(cost_usd=0.001))
    assert hours_table(led) == {T0: (1000, 1)}
    assert assert_exact(led, T0) == 1000


def test_r_res_10a_replayed_request_adds_nothing(make_ledger: LedgerFactory) -> None:
    led = make_ledger(**BIG)
    first = led.reserve("s", "alpha/small", input_bytes=10, request_id="r1")
    again = led.reserve("s", "alpha/small", input_bytes=10, request_id="r1")
    assert again.replayed
    assert hours_table(led) == {T0: (first.estimate_micro or 0, 1)}


def test_r_res_2_double_settle_refused_adds_nothing(make_ledger: LedgerFactory) -> None:
    led = make_ledger(**BIG)
    res = led.reserve("s", "alpha/small", input_bytes=10)
    led.settle(res.id, Success(cost_usd=0.25))
    with pytest.raises(UsageError):
        led.settle(res.id, Success(cost_usd=0.75))
    assert hours_table(led) == {T0: (250_000, 1)}


def test_r_res_2_refused_reservation_adds_nothing(make_ledger: LedgerFactory) -> None:
    led = make_ledger(**BIG, dailyEstimatedUsd=0.01)  # 10000: one 9192 fits, a second does not
    first = led.reserve("a", "alpha/small", input_bytes=1000)
    for key in ("alpha/small", "beta/free/unknown"):  # daily_cost_ceiling, unknown_price
        with pytest.raises(Refused):
            led.reserve("b", key, input_bytes=1000)
    assert hours_table(led) == {T0: (first.estimate_micro or 0, 1)}


CONTENDERS, OPERATIONS = 6, 30


def test_r_db_2_cost_hours_exact_under_process_contention(tmp_path: Path) -> None:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, callsPerHour=10**6, sourceCalls=3, dailyEstimatedUsd=1.2)
    Ledger.open(home, env={}).close()
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(CONTENDERS), ctx.Queue()
    sources = [f"src-{i}" for i in range(20)]
    procs = [
        ctx.Process(
            target=contention_worker,
            args=(str(home), barrier, seed, OPERATIONS, sources, list(PRICED), out),
        )
        for seed in range(CONTENDERS)
    ]
    for proc in procs:
        proc.start()
    reports = [out.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert [err for report in reports for err in report["errors"]] == []
    assert sum(report["settled"] for report in reports) > 0
    led = Ledger.open(home, env={})
    try:
        table = hours_table(led)
        assert table == hours_from_rows(led)
        assert sum(a for _c, a in table.values()) == sum(len(r["granted"]) for r in reports)
        with led.db.read() as conn:
            now = led.db.read_now(conn)
        assert_exact(led, now)
    finally:
        led.close()


# --- compaction (R-DB-6): folded rows are older than the window; their hours are never read --


def test_r_db_6_compaction_keeps_the_rolling_sum_exact(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(**BIG)
    for i in range(3 * 24 * 4):  # one reservation every 15 min over 3 days, all settled
        clock.ms = T0 + i * 15 * 60_000 + 7
        res = led.reserve(f"s{i}", PRICED[i % len(PRICED)], input_bytes=100 + i)
        led.settle(res.id, Success(cost_usd=(i % 5) / 1000))
    now = clock.ms
    before = {q: bucketed(led, q) for q in range(now, now + DAY + 2 * HOUR, HOUR // 4)}
    summary = compact(led.db, now, DAY)
    assert summary.folded > 0
    for q, value in before.items():  # every window from the ledger time on: unchanged, exact
        assert value == assert_exact(led, q)
    # hours wholly after the cut-off still equal their rows; older hours are left as they were
    table, rows = hours_table(led), hours_from_rows(led)
    assert {h: v for h, v in table.items() if h > summary.cutoff_ms} == {
        h: v for h, v in rows.items() if h > summary.cutoff_ms
    }
    assert len(table) == 3 * 24


# --- the read itself stays bounded however long the history ----------------------------------


def test_r_db_6_daily_cost_reads_by_index_only(make_ledger: LedgerFactory) -> None:
    led = make_ledger(**BIG)
    with led.db.read() as conn:
        stmt = reads._DAILY_COST.params(since=1, boundary=2)
        sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
        plan = [str(row[3]) for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")]
    searches = [p for p in plan if p.startswith("SEARCH")]
    assert len(searches) == 2, plan
    assert not [p for p in plan if p.startswith("SCAN") and p != "SCAN CONSTANT ROW"], plan
    assert any("ix_reservations_created (created_ms>? AND created_ms<?)" in p for p in searches)
    assert any("cost_hours" in p and "hour_start_ms>?" in p for p in searches)


# --- the migration backfills (R-DB-5: data survive the upgrade) --------------------------------

_INSERT = (
    "INSERT INTO reservations (source_id, model_key, provider, role, created_ms, deadline_ms,"
    " input_bytes, estimate_micro, status, cost_micro, policy_fp)"
    " VALUES ('src', 'alpha/small', 'alpha', 'primary', ?, ?, 10, ?, 'succeeded', ?, 'fp')"
)
HISTORY = [  # (created_ms, cost_micro)
    (T0 - 3 * DAY, 5),
    (T0 - HOUR - 1, 11),
    (T0 - 1, 13),
    (T0, 17),
    (T0, None),
    (T0 + 1, 19),
    (T0 + HOUR - 1, 23),
    (T0 + HOUR, 29),
    (T0 + 5 * HOUR + 12_345, 31),
]


def test_r_db_5_upgrade_backfills_cost_hours_from_every_reservation(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / "ledger.db"
    db = Database(f"sqlite:///{path}")
    migrate.upgrade(db, "0001")
    with sqlite_driver.connect(path) as raw:
        raw.execute(
            "INSERT INTO sources (id, state, created_ms, last_checked_ms)"
            " VALUES ('src', 'done', 0, 0)"
        )
        raw.executemany(_INSERT, [(c, c + 1, cost, cost) for c, cost in HISTORY])
    db.dispose()
    db = Database(f"sqlite:///{path}")
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.head_revision()
    db.dispose()
    clock.ms = T0 + 6 * HOUR
    led = Ledger.open(tmp_path, catalog=CATALOG, env={}, clock=clock)
    try:
        assert hours_table(led) == {
            T0 - 3 * DAY: (5, 1),
            T0 - 2 * HOUR: (11, 1),
            T0 - HOUR: (13, 1),
            T0: (17 + 19 + 23, 4),
            T0 + HOUR: (29, 1),
            T0 + 5 * HOUR: (31, 1),
        }
        for q in (T0, T0 + HOUR, T0 + DAY - 1, T0 + DAY, T0 + DAY + 1, T0 + DAY + HOUR):
            assert_exact(led, q)
        assert bucketed(led, T0 + DAY - 2) == 13 + 17 + 19 + 23 + 29 + 31
        res = led.reserve("new", "alpha/small", input_bytes=0)  # and it is maintained after
        assert hours_table(led)[T0 + 6 * HOUR] == (res.estimate_micro or 0, 1)
    finally:
        led.close()
    db = Database(f"sqlite:///{path}")
    migrate.downgrade(db, "0001")
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        kept = raw.execute("SELECT count(*) FROM reservations").fetchone()[0]
    assert "cost_hours" not in tables
    assert kept == len(HISTORY) + 1


# --- property: for random histories the bucketed sum is the plain SUM ------------------------


EDGE_STEPS = (1, 999, 60_000, HOUR - 1, HOUR, HOUR + 1, 5 * HOUR, DAY - 1, DAY, DAY + 1)
steps = st.sampled_from(EDGE_STEPS) | st.integers(1, 2 * DAY) | st.integers(-HOUR, -1)
index = st.integers(0, 99)
Op = tuple[str, int, int, int]
ops: st.SearchStrategy[Op] = st.one_of(
    st.tuples(st.just("clock"), steps, st.just(0), st.just(0)),
    st.tuples(
        st.just("reserve"), st.integers(0, len(MODELS) - 1), st.integers(0, 5000), st.just(0)
    ),
    st.tuples(st.just("success"), index, st.integers(0, 5000), st.integers(0, 999)),
    st.tuples(st.just("usd"), index, st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("failed"), index, st.integers(0, 5000), st.just(0)),
    st.tuples(st.just("cancel"), index, st.just(0), st.just(0)),
    st.tuples(
        st.just("compact"), st.sampled_from((DAY, DAY + HOUR, 2 * DAY)), st.just(0), st.just(0)
    ),
)


def _apply(led: Ledger, clock: Clock, op: Op, ids: list[int]) -> int | None:
    """Run one operation; returns the compaction cut-off when it compacted."""
    kind, a, b, c = op
    if kind == "clock":
        clock.advance(a)
        return None
    if kind == "reserve":
        ids.append(led.reserve(f"s{len(ids)}", MODELS[a], input_bytes=b).id)
        return None
    if kind == "compact":
        return compact(led.db, clock.ms, a).cutoff_ms
    if not ids:
        return None
    outcome: Success | Failed | Cancelled = Cancelled()
    if kind == "success":
        outcome = Success(b, c)
    elif kind == "usd":
        outcome = Success(cost_usd=b / 1_000_000)
    elif kind == "failed":
        outcome = Failed(classify_kind("unknown"), input_tokens=b, output_tokens=0)
    with suppress(UsageError, NotFoundError):  # already settled, or compacted away
        led.settle(ids[a % len(ids)], outcome)
    return None


@given(history=st.lists(ops, max_size=40), offsets=st.lists(steps | st.just(0), max_size=8))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_r_res_2_r_res_1_bucketed_sum_and_hour_count_equal_the_rows_for_random_histories(
    history: list[Op], offsets: list[int]
) -> None:
    clock = Clock(T0 + 1234)
    newest = clock.ms
    cutoff: int | None = None
    with scratch_ledger(clock, Policy.model_validate(BIG)) as led:
        ids: list[int] = []
        for op in history:
            done = _apply(led, clock, op, ids)
            if done is not None:
                cutoff = done if cutoff is None else max(cutoff, done)
            newest = max(newest, clock.ms)
            assert_exact(led, newest)  # what the next reserve would read
            assert_hourly_exact(led, newest)  # R-RES-1: compaction never touches the last hour
        for offset in offsets:
            assert_exact(led, newest + abs(offset))
            assert_hourly_exact(led, newest + abs(offset))
        if cutoff is None:  # the bookkeeping itself: every hour equals its rows
            assert hours_table(led) == hours_from_rows(led)
            for offset in offsets:  # and any window at all, even one before the ledger time
                assert_exact(led, newest - abs(offset))
        else:
            table, rows = hours_table(led), hours_from_rows(led)
            assert {h: v for h, v in table.items() if h > cutoff} == {
                h: v for h, v in rows.items() if h > cutoff
            }


# --- selection reads the window's rows only when an estimate may not fit (issue 23 speed) ------


def test_r_sel_10_select_state_reads_window_rows_only_when_an_estimate_may_not_fit(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    from ledger.store.views import select_state

    ceiling = 50_000
    led = make_ledger(**BIG, dailyEstimatedUsd=0.05)
    for i in range(3):  # 3 x 9192 micro-USD
        clock.advance(1_000)
        led.reserve(f"s{i}", "alpha/small", input_bytes=1000)
    spent = plain(led, clock.ms)
    assert spent == 3 * 9192
    room = ceiling - spent
    roomy = select_state(led.db, None, 10**6, ceiling, need_micro=room)
    assert roomy.daily == DailyWindow(spent, ceiling, (), room_for_micro=room)
    tight = select_state(led.db, None, 10**6, ceiling, need_micro=room + 1)
    assert tight.daily is not None
    assert tight.daily.room_for_micro is None
    assert tight.daily.spent_micro == spent
    assert [cost for _, cost in tight.daily.leaving] == [9192] * 3
    unbounded = select_state(led.db, None, 10**6, ceiling)
    assert unbounded.daily == tight.daily


def test_r_sel_10_a_window_read_for_smaller_estimates_never_answers_never() -> None:
    from ledger.budgets.checks import ceiling_frees_at

    window = DailyWindow(40, 100, (), room_for_micro=60)
    assert ceiling_frees_at(7, window, 60) == 7
    with pytest.raises(ValueError, match="smaller estimates"):
        ceiling_frees_at(7, window, 61)


def test_r_sel_10_ledger_select_skips_the_window_rows_while_every_model_fits(
    make_ledger: LedgerFactory, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    windows: list[DailyWindow] = []
    real = reads.daily_window

    def spy(*args: Any, **kwargs: Any) -> DailyWindow:
        window = real(*args, **kwargs)
        windows.append(window)
        return window

    monkeypatch.setattr(reads, "daily_window", spy)
    led = make_ledger(**BIG, dailyEstimatedUsd=1.0, defaultModel="alpha/small")
    led.reserve("s0", "alpha/small", input_bytes=1000)
    assert led.select("s1", input_bytes=1000).routes
    (window,) = windows
    assert window.leaving == ()
    assert window.spent_micro == plain(led, clock.ms) == 9192


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_res_1_rolling_hour_count_is_exact_at_the_edges(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    """The rolling hour's count equals the count over (now - 1 h, now] for grants
    on, just before and just after an hour boundary, read a millisecond before, as and after
    each one leaves (in time order, as the ledger would); when full, the next slot frees when
    the oldest counted grant past the limit leaves (the refusal path reads the rows)."""
    led = make_ledger(**BIG)
    base = T0 + 2 * HOUR  # an hour boundary after anything opening the ledger may write
    grants = [base + g for g in (-1, 0, 1, HOUR // 2, HOUR - 1, HOUR, HOUR + 1)]
    reads_at = {g + d for g in grants for d in (HOUR - 1, HOUR, HOUR + 1)}
    granted: list[int] = []
    for now in sorted({*grants, *reads_at}):
        if now in grants:
            clock.ms = now
            res = led.reserve(f"h{len(granted)}", "alpha/small", input_bytes=10)
            assert res.created_ms == now
            granted.append(now)
        if now not in reads_at:
            continue
        counted = sorted(t for t in granted if t > now - HOUR)
        assert hourly_plain(led, now) == len(counted), now
        with led.db.read() as conn:
            assert reads.hourly_usage(conn, now, 10**6) == (len(counted), None), now
            for limit in range(1, len(counted) + 1):  # full: the row past the limit leaves
                expected = (len(counted), counted[len(counted) - limit] + HOUR)
                assert reads.hourly_usage(conn, now, limit) == expected, (now, limit)
    assert granted == grants
    assert hours_table(led) == hours_from_rows(led)
