"""Issue 32: revision 0007 (scopes and gateway keys) upgrades a ledger with data from the
previous head, keeps every row, and the upgraded ledger then enforces scopes (R-SC-1, R-DB-5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.errors import Refused
from ledger.store import Database, migrate, sqlite_driver
from tests.support.ledgers import T0, TEST_CATALOG, Clock

# The revision 0007 follows. Re-pointing 0007 at merge changes this one line.
PREVIOUS_HEAD = "0006"


def test_issue32_0007_upgrades_from_the_previous_head_with_data(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    db = Database(f"sqlite:///{path}")
    migrate.upgrade(db, PREVIOUS_HEAD)
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        raw.execute(f"INSERT INTO clock (id, newest_ms) VALUES (1, {T0})")
        raw.execute(
            "INSERT INTO sources (id, state, created_ms, last_checked_ms)"
            f" VALUES ('src', 'queued', {T0}, {T0})"
        )
        raw.execute(
            "INSERT INTO reservations (source_id, model_key, provider, role, created_ms,"
            " deadline_ms, input_bytes, estimate_micro, status, cost_micro, policy_fp)"
            f" VALUES ('src', 'alpha/small', 'alpha', 'primary', {T0}, {T0 + 60_000}, 10, 7,"
            " 'open', 7, 'fp')"
        )
    db = Database(f"sqlite:///{path}")
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.HEAD_REVISION
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        kept = raw.execute("SELECT source_id, status, cost_micro FROM reservations").fetchall()
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert kept == [("src", "open", 7)]
    assert {"reservation_scopes", "source_scopes", "gateway_keys"} <= tables
    policy = Policy.model_validate({"scopes": {"one": {"inFlight": 1}}})
    led = Ledger.open(
        tmp_path,
        policy=policy,
        catalog=Catalog.model_validate(TEST_CATALOG),
        env={},
        clock=Clock(T0 + 1000),
    )
    try:
        led.add_source("src", scopes=["one"])  # the old reservation was granted under no scope
        led.reserve("src", "alpha/small")
        with pytest.raises(Refused) as info:
            led.reserve("src", "alpha/small")
        assert (info.value.reason, info.value.scope) == ("scope_in_flight", "one")
    finally:
        led.close()
    db = Database(f"sqlite:///{path}")
    migrate.downgrade(db, PREVIOUS_HEAD)
    db.dispose()
    with sqlite_driver.connect(path) as raw:
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        count = raw.execute("SELECT COUNT(*) FROM reservations").fetchone()
    assert not {"reservation_scopes", "source_scopes", "gateway_keys"} & tables
    assert count == (2,)
