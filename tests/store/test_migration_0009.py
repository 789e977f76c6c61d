"""R-SC-3a, R-DB-5: revision 0009 (request ids unique per namespace) upgrades a ledger with data
from revision 0008: every row is in the default namespace, an old request id still finds its
reservation, the scope rows pointing at the rebuilt table (SQLite) are all kept, and a gateway
key may then use the same id for a request of its own. Downgrade restores the unique request id,
forgetting only the keys' ids. Both backends."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import text

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.errors import UsageError
from ledger.store import Database, migrate
from tests.support.backends import BACKENDS
from tests.support.ledgers import T0, TEST_CATALOG, Clock

PREVIOUS = "0008"
MODEL = "alpha/small"


def _fill(db: Database) -> int:
    """An open reservation of 0008 with request id `old-1`, under scope `b`; its id."""
    with db.engine.begin() as conn:
        conn.execute(text(f"INSERT INTO clock (id, newest_ms) VALUES (1, {T0})"))
        conn.execute(text(
            "INSERT INTO sources (id, state, created_ms, last_checked_ms)"
            f" VALUES ('src', 'queued', {T0}, {T0})"
        ))
        rid = int(conn.execute(text(
            "INSERT INTO reservations (request_id, source_id, model_key, provider, role,"
            " created_ms, deadline_ms, input_bytes, estimate_micro, status, cost_micro, policy_fp)"
            f" VALUES ('old-1', 'src', '{MODEL}', 'alpha', 'primary', {T0}, {T0 + 600_000}, 10,"
            " 7, 'open', 7, 'fp') RETURNING id"
        )).scalar_one())
        conn.execute(text(
            "INSERT INTO reservation_scopes (reservation_id, scope, created_ms)"
            f" VALUES ({rid}, 'b', {T0})"
        ))
        conn.execute(text(
            f"INSERT INTO scope_cost_hours (scope, hour_start_ms, cost_micro, calls)"
            f" VALUES ('b', {T0 - T0 % 3_600_000}, 7, 1)"
        ))
    return rid


def _reservations(db: Database) -> list[tuple[object, ...]]:
    with db.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            text("SELECT id, request_id, source_id FROM reservations ORDER BY id")
        )]  # fmt: skip


def _scope_rows(db: Database) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM reservation_scopes")).scalar_one())


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_3a_0009_keeps_old_request_ids_working_with_data(
    tmp_path: Path, ledger_db: str | None
) -> None:
    url = ledger_db or f"sqlite:///{tmp_path / 'ledger.db'}"
    db = Database(url)
    migrate.upgrade(db, PREVIOUS)
    old = _fill(db)
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.HEAD_REVISION
    with db.engine.connect() as conn:
        namespaces = conn.execute(text("SELECT namespace FROM reservations")).scalars().all()
        table = None
        if not ledger_db:
            table = str(conn.execute(text(
                "SELECT sql FROM sqlite_master WHERE name = 'reservations'"
            )).scalar_one())  # fmt: skip
    assert namespaces == [""]
    assert _scope_rows(db) == 1  # the rebuilt table's scope rows are all still there
    assert table is None or "ck_reservations_status" in table  # its CHECK survives the rebuild
    db.dispose()
    policy = Policy.model_validate({"callsPerHour": 100, "scopes": {"b": {"callsPerHour": 10}}})
    led = Ledger.open(tmp_path, url if ledger_db else None, policy=policy,
                      catalog=Catalog.model_validate(TEST_CATALOG), env={},
                      clock=Clock(T0 + 1000))  # fmt: skip
    try:
        again = led.reserve("src", MODEL, request_id="old-1")  # the old row keeps working
        assert (again.id, again.replayed) == (old, True)
        with pytest.raises(UsageError, match="already used"):  # still unique for non-key callers
            led.reserve("other", MODEL, request_id="old-1")
        step = led.reserve_step("k-src", MODEL, request_id="old-1", scopes=["b"], gateway_key="ci")
        (answered,) = led.write_steps([step])
        mine = answered.get()  # a key's own namespace: a new request, not the old one
        assert mine.id != old
        assert not mine.replayed
    finally:
        led.close()
    db = Database(url)
    migrate.downgrade(db, PREVIOUS)
    assert _reservations(db) == [(old, "old-1", "src"), (mine.id, None, "k-src")]
    assert _scope_rows(db) == 2
    with pytest.raises(sqlalchemy.exc.IntegrityError), db.engine.begin() as conn:
        conn.execute(text(  # the request id alone is unique again
            "INSERT INTO reservations (request_id, source_id, model_key, provider, role,"
            " created_ms, deadline_ms, input_bytes, status, policy_fp)"
            f" VALUES ('old-1', 'src', '{MODEL}', 'alpha', 'primary', {T0}, {T0}, 1, 'open', 'fp')"
        ))
    db.dispose()
