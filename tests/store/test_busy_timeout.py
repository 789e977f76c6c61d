"""Issue 20 item 7, R-DB-3 / R-CFG-2: `busyTimeoutMs` is bounded by what both backends can take.

SQLite's busy timeout and PostgreSQL's `lock_timeout` are 32-bit signed milliseconds: a larger
value used to validate and then became a 0 ms SQLite timeout (and a connection PostgreSQL
refused). The policy refuses it; the largest accepted value reaches both backends unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from ledger.api import Ledger
from ledger.cli.main import cli
from ledger.config import Policy, policy_schema
from tests.support.backends import BACKENDS, fresh_pg_database
from tests.support.ledgers import TEST_CATALOG
from tests.support.procs import write_home

INT32_MAX = 2**31 - 1


def test_issue20_7_r_cfg_2_busy_timeout_above_int32_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "h"
    write_home(home, TEST_CATALOG, busyTimeoutMs=INT32_MAX + 1)
    result = CliRunner().invoke(cli, ["--home", str(home), "config", "validate"])
    assert result.exit_code == 2
    assert len(result.output.splitlines()) == 1
    assert result.output.rstrip().endswith("recovery.json: busyTimeoutMs: is too large")
    assert str(INT32_MAX + 1) not in result.output  # never echoes the value
    assert not (home / "ledger.db").exists()


def test_issue20_7_the_bound_is_in_the_printed_schema() -> None:
    prop = policy_schema()["properties"]["busyTimeoutMs"]
    assert prop["maximum"] == INT32_MAX
    assert Policy.model_validate({"busyTimeoutMs": INT32_MAX}).busy_timeout_ms == INT32_MAX


@pytest.mark.parametrize("backend", BACKENDS)
def test_issue20_7_the_largest_busy_timeout_reaches_the_backend_unchanged(
    tmp_path: Path, backend: str
) -> None:
    home = tmp_path / "h"
    write_home(home, TEST_CATALOG, busyTimeoutMs=INT32_MAX)
    if backend == "sqlite":
        led = Ledger.open(home, env={})
        try:
            assert led.reserve("s1", "alpha/small").id == 1
            with led.store.db.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == INT32_MAX
        finally:
            led.close()
        return
    with fresh_pg_database() as url:
        led = Ledger.open(home, url, env={})
        try:
            assert led.reserve("s1", "alpha/small").id == 1
            with led.store.db.engine.connect() as conn:
                shown = conn.execute(text("SHOW lock_timeout")).scalar()
            assert shown == f"{INT32_MAX}ms", shown
        finally:
            led.close()

