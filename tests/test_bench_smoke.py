"""Issue 9: the benchmark harness runs in its tiny --quick mode and writes a results table.

No timing assertions: speed targets live in the benchmark, never in tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.__main__ import main


@pytest.mark.slow
def test_bench_quick_mode_runs_and_writes_a_table(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    assert main(["--quick", "--out", str(out), "--scratch", str(tmp_path)]) == 0
    text = out.read_text()
    assert "| figure | median |" in text
    for figure in (
        "ledger cycle / floor",
        "contention: 2 processes",
        "handoff: fair-turn ceiling at 2 processes",
        "selection:",
        "growth:",
        "service: LedgerClient cycle / in-process cycle",  # issue 21
        "service: CLI pair / curl pair",
        "service: 2 client processes, total cycles/s vs 1 in-process",
        "simulate: a day of",  # issue 23: the simulator's speed and memory figure
    ):
        assert figure in text
    assert "SQLite" in text
    assert "journal mode" in text
    assert "failed" not in text
    if os.environ.get("LEDGER_TEST_PG_URL"):  # issue 16: PostgreSQL beside SQLite
        assert "fleet cycle: PostgreSQL / SQLite" in text
        assert "fleet contention: PostgreSQL / SQLite (2 processes)" in text
    assert not list(tmp_path.glob("ledger-bench-*")), "scratch databases are removed"
