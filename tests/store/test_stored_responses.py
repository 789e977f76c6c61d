"""The stored-responses table (R-FMT-2, migration 0011) on SQLite and PostgreSQL: who answered
a kept response is recorded, replaced by a later record of the same id, forgotten after 30 days
and pruned as new rows arrive; an id longer than the column is never recorded."""

from __future__ import annotations

import pytest

from ledger.store.stored_responses import KEEP_MS, provider_of, remember
from tests.support.backends import BACKENDS
from tests.support.ledgers import Clock, LedgerFactory


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_stored_responses_recorded_replaced_and_pruned_r_fmt_2(
    make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    db = make_ledger().db
    with db.write() as txn:
        remember(txn.conn, txn.now, "resp_1", "rapid", "rapid/r1")
        remember(txn.conn, txn.now, "x" * 201, "rapid", "rapid/r1")
    assert provider_of(db, "resp_1", clock()) == "rapid"
    assert provider_of(db, "resp_unknown", clock()) is None
    assert provider_of(db, "x" * 201, clock()) is None
    with db.write() as txn:
        remember(txn.conn, txn.now, "resp_1", "rover", "rover/r2")
    assert provider_of(db, "resp_1", clock()) == "rover"
    clock.advance(KEEP_MS + 1)
    assert provider_of(db, "resp_1", clock()) is None  # past 30 days: forgotten
    with db.write() as txn:
        remember(txn.conn, txn.now, "resp_2", "rapid", "rapid/r1")
    with db.engine.connect() as conn:
        ids = [r[0] for r in conn.exec_driver_sql("SELECT response_id FROM stored_responses")]
    assert ids == ["resp_2"]  # the old row was pruned by the new one's transaction
