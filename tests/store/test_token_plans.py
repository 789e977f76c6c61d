"""R-TOK-3: a token window's overrun part (usage above the estimate, counted at its settle time)
reads only the overruns settled inside the window, from their partial index, on both backends
and without statistics; before revision 0014 it read a day of the target's grants on every
reserve (16,700 rows a reserve at a million attempts over 60 days), before revision 0015 every
row settled in the window. A day's window reads its whole hours from token_hours, a minute's its
whole seconds from token_seconds (R-TOK-2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, select, text

from ledger.budgets.unit import Dimension, Measure, Window
from ledger.store import usage
from ledger.store.dialects import make_engine
from tests.support.backends import BACKENDS, db_url
from tests.support.ledgers import T0, Clock, LedgerFactory

KEYS = [
    (Window.ROLLING_MINUTE, Measure.TOKENS, Dimension.MODEL, "alpha/small"),
    (Window.ROLLING_MINUTE, Measure.TOKENS, Dimension.PROVIDER, "alpha"),
    (Window.ROLLING_MINUTE, Measure.INPUT_TOKENS, Dimension.GLOB, "alpha/*"),
    (Window.ROLLING_MINUTE, Measure.OUTPUT_TOKENS, Dimension.SCOPE, "night"),
    (Window.ROLLING_DAY, Measure.TOKENS, Dimension.PROVIDER, "alpha"),
]

_PG_ROWS = """
INSERT INTO reservations (source_id, model_key, provider, role, created_ms, deadline_ms,
  input_bytes, status, settled_ms, input_tokens, output_tokens, cost_micro, policy_fp,
  estimate_input_tokens, estimate_output_tokens, overrun_ms)
SELECT 's0', 'alpha/small', 'alpha', 'primary', :t0 - g * 1000, :t0 - g * 1000 + 120000, 300,
  'succeeded', :t0 - g * 1000 + 500, 100, 150, 0, 'plan', 100, 100,
  CASE WHEN g % 50 = 0 THEN :t0 - g * 1000 + 500 END
FROM generate_series(1, 20000) g
"""


def _plan(url: str, key: Any, overrun_only: bool) -> str:
    """The plan of `key`'s window read, or of its overrun part alone."""
    engine = make_engine(url, busy_timeout_ms=10_000)
    try:
        with engine.connect() as conn:
            planned = usage.plan(T0, [key], engine.dialect.name)
            assert planned is not None
            stmt, params = planned
            if overrun_only:
                target: Any = bindparam("u0_target")
                since: Any = bindparam("u0_since")
                stmt = select(usage._overrun(key[2], key[1], target, since).label("u0"))
            compiled = stmt.compile(dialect=engine.dialect)
            bound = compiled.construct_params(params)
            if engine.dialect.name == "sqlite":
                args = tuple(bound[name] for name in compiled.positiontup or ())
                found = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", args)
                return "\n".join(str(r[-1]) for r in found)
            return "\n".join(str(r[0]) for r in conn.exec_driver_sql(f"EXPLAIN {compiled}", bound))
    finally:
        engine.dispose()


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_3_the_overrun_read_uses_the_overrun_index_without_statistics(
    make_ledger: LedgerFactory, clock: Clock, home: Path, ledger_db: str | None
) -> None:
    led = make_ledger(callsPerHour=1000, sourceCalls=100_000, scopes={"night": {}})
    led.reserve("s0", "alpha/small", input_bytes=300, scopes=("night",))
    url = db_url(home, ledger_db)
    if ledger_db is not None:  # a table PostgreSQL has never analyzed, big enough to plan for
        engine = make_engine(url, busy_timeout_ms=10_000)
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE reservations SET (autovacuum_enabled = false)"))
            conn.execute(text(_PG_ROWS), {"t0": T0})
        engine.dispose()
    for key in KEYS:
        plan = _plan(url, key, overrun_only=True)
        assert usage.OVERRUN_INDEX in plan, (key, plan)
        assert "ix_reservations_model" not in plan, (key, plan)
        assert "ix_reservations_created" not in plan, (key, plan)
    day = _plan(url, KEYS[-1], overrun_only=False)
    assert "token_hours" in day, day
    for key in KEYS[:-1]:  # a minute's window reads its whole seconds from the second totals
        minute = _plan(url, key, overrun_only=False)
        assert "token_seconds" in minute, (key, minute)
        if ledger_db is None:  # SQLite: from an index over the second, never the whole table
            assert "SCAN token_seconds" not in minute, (key, minute)
            assert "SCAN scope_token_seconds" not in minute, (key, minute)
