"""R-DB-1, R-DB-5 for revision 0006 (routing, issue 30): an 0005 ledger with data upgrades, keeps
every reservation (pool and effort NULL), and reserves through a pool at once; on PostgreSQL too."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.store import Database, migrate
from tests.support.backends import BACKENDS
from tests.support.ledgers import T0, Clock
from tests.support.routing_fixtures import MEMBERS, routing_catalog


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_db_5_0005_upgrades_to_0006_with_data(tmp_path: Path, ledger_db: str | None) -> None:
    url = ledger_db or f"sqlite:///{tmp_path / 'ledger.db'}"
    db = Database(url)
    migrate.upgrade(db, "0005")
    with db.engine.begin() as conn:
        conn.execute(text("INSERT INTO clock (id, newest_ms) VALUES (1, :t)"), {"t": T0})
        conn.execute(
            text(
                "INSERT INTO sources (id, state, in_queue, created_ms, last_checked_ms, failures,"
                " output_failures, backoff_steps, correction_used)"
                " VALUES ('s1', 'queued', false, :t, :t, 0, 0, 0, false)"
            ),
            {"t": T0},
        )
        conn.execute(
            text(
                "INSERT INTO reservations (source_id, model_key, provider, role, created_ms,"
                " deadline_ms, input_bytes, estimate_micro, status, cost_micro, policy_fp, late,"
                " side_effects) VALUES ('s1', 'acct1/m', 'acct1', 'primary', :t, :d, 10, 5,"
                " 'succeeded', 5, 'fp', false, false)"
            ),
            {"t": T0, "d": T0 + 1000},
        )
    db.dispose()
    db = Database(url)
    migrate.upgrade(db)  # through 0006 to the head
    assert migrate.current_revision(db) == migrate.HEAD_REVISION
    with db.engine.connect() as conn:
        kept = conn.execute(text("SELECT model_key, pool, effort FROM reservations")).all()
        cursors = conn.execute(text("SELECT COUNT(*) FROM pool_cursors")).scalar()
    db.dispose()
    assert [tuple(r) for r in kept] == [("acct1/m", None, None)]
    assert cursors == 0
    policy = Policy.model_validate(
        {"pools": {"p": {"candidates": MEMBERS, "strategy": "round-robin"}}, "sourceModels": 9}
    )
    led = Ledger.open(
        tmp_path, ledger_db, policy=policy, catalog=Catalog.model_validate(routing_catalog()),
        env={}, clock=Clock(T0 + 5000),
    )  # fmt: skip
    try:
        got = [led.reserve("s1", "pool/p", input_bytes=10).model for _ in range(2)]
    finally:
        led.close()
    assert got == MEMBERS[:2]
    db = Database(url)
    migrate.downgrade(db, "0005")
    with db.engine.connect() as conn:
        count = conn.execute(text("SELECT COUNT(*) FROM reservations")).scalar()
    db.dispose()
    assert count == 3
