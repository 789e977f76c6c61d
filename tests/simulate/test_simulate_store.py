"""Issue 23 / R-SIM-1: the simulator's ledger is a throw-away SQLite file built by the migrations.

Durability is irrelevant for a temporary file one process uses and deletes, so it is opened
without fsync, with its rollback journal in memory and without the write-lock file; a ledger
opened any other way keeps the production settings.
"""

from __future__ import annotations

import random
from pathlib import Path

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.simulate.runner import _throwaway_ledger
from ledger.simulate.vclock import VirtualClock
from ledger.store import migrate
from ledger.store.writelock import lock_path
from tests.support.ledgers import TEST_CATALOG


def _settings(led: Ledger) -> tuple[int, str, str | None]:
    with led.db.engine.connect() as conn:
        sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
        mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
    with led.db.read() as conn:
        revision = migrate.read_revision(conn)
    return int(sync or 0), str(mode), revision


def test_r_sim_1_the_simulated_ledger_is_throwaway_and_built_by_the_migrations(
    tmp_path: Path,
) -> None:
    catalog = Catalog.model_validate(TEST_CATALOG)
    led = _throwaway_ledger(tmp_path, Policy(), catalog, VirtualClock(1_000), random.Random(1))
    try:
        assert led.add_source("a", "ref-a")  # a write transaction
        sync, mode, revision = _settings(led)
        assert (sync, mode) == (0, "memory")  # synchronous=OFF
        assert revision == migrate.head_revision()
        lock = lock_path(led.state.db_url)
        assert lock is not None
        assert not lock.exists()
        assert led.db.clock_fn() == 1_000  # the virtual clock
    finally:
        led.close()


def test_r_sim_1_an_ordinary_ledger_keeps_fsync_and_the_write_lock(tmp_path: Path) -> None:
    led = Ledger.open(tmp_path, catalog=Catalog.model_validate(TEST_CATALOG), env={})
    try:
        assert led.add_source("a", "ref-a")
        sync, mode, _ = _settings(led)
        assert sync == 2  # synchronous=FULL
        assert mode == led.db.journal_mode != "memory"
        lock = lock_path(led.state.db_url)
        assert lock is not None
        assert lock.exists()
    finally:
        led.close()
