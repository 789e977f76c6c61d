"""Issue 32: revision 0008 (each scope's calls per hour beside its cost) upgrades a ledger with
data from revision 0007: every hour total gets its calls counted from the scope rows, an hour
with scope rows but no totals row gets one (its cost summed from the reservations), and the
upgraded ledger enforces the scope's rolling hour exactly (R-SC-1, R-DB-5). Both backends."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Connection, text

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.errors import Refused
from ledger.store import Database, migrate
from tests.support.backends import BACKENDS
from tests.support.ledgers import TEST_CATALOG, Clock

PREVIOUS = "0007"
HOUR = 3_600_000
H0 = 1_780_000_000_000 - 1_780_000_000_000 % HOUR  # an hour edge


def _fill(db: Database) -> None:
    """Three scoped reservations of scope `b` in two hours (one also under `a`): the 0007 code
    wrote a totals row for each scope and hour; the second hour's row of `b` is missing, as in a
    hand-edited file."""
    first = H0 + HOUR - 120_000
    reservations = [(first, 7), (H0 + HOUR - 60_000, 11), (H0 + HOUR + 5, 13)]
    with db.engine.begin() as conn:
        conn.execute(text(f"INSERT INTO clock (id, newest_ms) VALUES (1, {H0 + HOUR + 5})"))
        conn.execute(text(
            "INSERT INTO sources (id, state, created_ms, last_checked_ms)"
            f" VALUES ('src', 'queued', {H0}, {H0})"
        ))
        ids = []
        for created, cost in reservations:
            ids.append(conn.execute(text(
                "INSERT INTO reservations (source_id, model_key, provider, role, created_ms,"
                " deadline_ms, input_bytes, estimate_micro, status, cost_micro, policy_fp)"
                f" VALUES ('src', 'alpha/small', 'alpha', 'primary', {created},"
                f" {created + 60_000}, 10, {cost}, 'succeeded', {cost}, 'fp') RETURNING id"
            )).scalar_one())
            conn.execute(text(
                "INSERT INTO reservation_scopes (reservation_id, scope, created_ms)"
                f" VALUES ({ids[-1]}, 'b', {created})"
            ))
        conn.execute(text(
            "INSERT INTO reservation_scopes (reservation_id, scope, created_ms)"
            f" VALUES ({ids[0]}, 'a', {first})"
        ))
        conn.execute(text(
            "INSERT INTO scope_cost_hours (scope, hour_start_ms, cost_micro) VALUES"
            f" ('b', {H0}, 18), ('a', {H0}, 7)"
        ))


def _without_rowid(conn: Connection) -> bool:
    sql = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE name = 'reservation_scopes'")
    ).scalar_one()
    return "WITHOUT ROWID" in str(sql)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_issue32_0008_counts_each_scope_hour_from_its_rows_with_data(
    tmp_path: Path, ledger_db: str | None
) -> None:
    url = ledger_db or f"sqlite:///{tmp_path / 'ledger.db'}"
    db = Database(url)
    migrate.upgrade(db, PREVIOUS)
    _fill(db)
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.HEAD_REVISION
    with db.engine.connect() as conn:
        totals = conn.execute(text(
            "SELECT scope, hour_start_ms, cost_micro, calls FROM scope_cost_hours"
            " ORDER BY scope, hour_start_ms"
        )).all()
        kept = conn.execute(text("SELECT COUNT(*) FROM reservation_scopes")).scalar_one()
        rowid = _without_rowid(conn) if not ledger_db else None
    db.dispose()
    assert rowid in (None, True)  # SQLite: the table is its primary key now
    assert [tuple(r) for r in totals] == [
        ("a", H0, 7, 1), ("b", H0, 18, 2), ("b", H0 + HOUR, 13, 1)
    ]
    assert kept == 4
    policy = Policy.model_validate({"callsPerHour": 100, "scopes": {"b": {"callsPerHour": 4}}})
    led = Ledger.open(tmp_path, url if ledger_db else None, policy=policy,
                      catalog=Catalog.model_validate(TEST_CATALOG), env={},
                      clock=Clock(H0 + HOUR + 30_000))
    try:
        led.reserve("new1", "alpha/small", scopes=["b"])  # the 4th of the rolling hour
        with pytest.raises(Refused) as info:
            led.reserve("new2", "alpha/small", scopes=["b"])
        assert (info.value.reason, info.value.scope) == ("scope_hourly_budget", "b")
        assert info.value.retry_at_ms == H0 + 2 * HOUR - 120_000  # when the oldest one leaves
    finally:
        led.close()
    db = Database(url)
    migrate.downgrade(db, PREVIOUS)
    with db.engine.connect() as conn:
        columns = conn.execute(text("SELECT * FROM scope_cost_hours")).keys()
        count = conn.execute(text("SELECT COUNT(*) FROM reservation_scopes")).scalar_one()
        rowid = _without_rowid(conn) if not ledger_db else None
    db.dispose()
    assert rowid in (None, False)
    assert "calls" not in list(columns)
    assert count == 5
