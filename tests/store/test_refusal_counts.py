"""R-DIAG-1 in the store, on both backends: refusal counts are per-minute rows keyed by reason,
scope and gateway key; a batch of any number of refusals adds to them (never a row per refusal),
rows past two hours go, and status reads the last hour grouped, the most frequent first."""

from __future__ import annotations

from collections import Counter

import pytest

from ledger.store.refusal_counts import MINUTE_MS, RefusalKey, RefusalTotal, add_counts, last_hour
from ledger.store.status_views import status_data
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import T0, Clock, LedgerFactory

HOUR = 3_600_000


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_diag_1_refusals_a_flood_of_refusals_is_a_few_rows_added_to_in_one_transaction(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None, home: object
) -> None:
    ledger = make_ledger()
    minute = T0 - T0 % MINUTE_MS
    flood: Counter[RefusalKey] = Counter()
    for i in range(10_000):  # one service's tally of a flood: three distinct rows
        if i % 10 == 0:
            flood[RefusalKey(minute, "shared_hourly_budget")] += 1
        elif i % 2:
            flood[RefusalKey(minute, "scope_hourly_budget", "team-a", "batch")] += 1
        else:
            flood[RefusalKey(minute, "scope_in_flight", "team-b", "")] += 1
    with ledger.db.write() as txn:
        add_counts(txn.conn, txn.now, flood)
    with ledger.db.write() as txn:  # another batch (another service) adds to the same rows
        add_counts(txn.conn, txn.now, Counter({RefusalKey(minute, "shared_hourly_budget"): 5}))
    url = db_url(home, ledger_db)  # type: ignore[arg-type]
    stored = rows(url, "SELECT reason, scope, key_name, count FROM refusal_minutes "
                       "ORDER BY reason")  # fmt: skip
    assert stored == [
        ("scope_hourly_budget", "team-a", "batch", 5000),
        ("scope_in_flight", "team-b", "", 4000),
        ("shared_hourly_budget", "", "", 1005),
    ]
    with ledger.db.read() as conn:
        totals = last_hour(conn, clock())
    assert totals == [
        RefusalTotal("scope_hourly_budget", "team-a", "batch", 5000, minute),
        RefusalTotal("scope_in_flight", "team-b", "", 4000, minute),
        RefusalTotal("shared_hourly_budget", "", "", 1005, minute),
    ]


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_diag_1_refusals_status_reads_the_last_hour_and_old_minutes_are_dropped(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None, home: object
) -> None:
    ledger = make_ledger()
    minute = T0 - T0 % MINUTE_MS
    batch = Counter({
        RefusalKey(minute - 3 * HOUR, "probing"): 7,  # past two hours: dropped on the next add
        RefusalKey(minute - 90 * MINUTE_MS, "model_cooldown"): 3,  # kept, but not in the hour
        RefusalKey(minute - 59 * MINUTE_MS, "scope_daily_cost", "team-a", "k1"): 2,
        RefusalKey(minute - 5 * MINUTE_MS, "scope_daily_cost", "team-a", "k1"): 4,
    })  # fmt: skip
    with ledger.db.write() as txn:
        add_counts(txn.conn, txn.now, batch)
    url = db_url(home, ledger_db)  # type: ignore[arg-type]
    kept = rows(url, "SELECT reason FROM refusal_minutes ORDER BY minute_ms")
    assert kept == [("model_cooldown",), ("scope_daily_cost",), ("scope_daily_cost",)]
    data = status_data(ledger.db, ledger.policy.calls_per_hour, ledger.policy)
    assert data.refusals == [
        RefusalTotal("scope_daily_cost", "team-a", "k1", 6, minute - 5 * MINUTE_MS)
    ]
    clock.advance(HOUR)  # an hour on: nothing left in the window
    assert status_data(ledger.db, ledger.policy.calls_per_hour).refusals == []
