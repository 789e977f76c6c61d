"""Issue 9: the benchmark harness runs in its tiny --quick mode and writes a results table.

No timing assertions: speed targets live in the benchmark, never in tests.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main, parse_args
from ledger.store.engine import chosen_journal_mode, wal_is_safe


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
        "service-slow-sync: 2 client",  # issue 46: group commit where a sync costs 2 ms
        "simulate: a day of",  # issue 23: the simulator's speed and memory figure
        "simulate: read the largest trace",  # issue 29 item 17: streamed, bounded memory
        "scopes: reserve under 3 scopes / plain reserve",  # issue 32
        # issue 32: the burst beside snipz (its rows measured when its venv exists, else skipped)
        "| scopes burst: ledger overshoot (160 reservations from 4 processes, $1 daily limit) "
        "| $0.000000 |",
        "scopes burst: ledger reservations/s",
        "scopes burst: snipz overshoot",
        "scopes burst: ledger / snipz reservations/s",
        "gateway: time to first byte beyond the reserve / the floor",  # issue 31 (not a goal)
        # issue 46: checkpoints under a status reader, and the client ratio by both methods
        "checkpoint: p99 of the 2,000 cycles that met a checkpoint / p99 of the others",
        "checkpoint: -wal file size after 2,000 cycles with a status reader",
        "checkpoint (candidate: writer's checkpoint(TRUNCATE) above 4.0 MiB): -wal file size",
        "client: LedgerClient cycle / in-process cycle, alternating every 10 cycles",
        "client: LedgerClient cycle / in-process cycle, each side's 10 cycles in one block",
        # SPEC section 22: what token budgets add to a reserve
        "tokens: cycle under a model's and a provider's tokensPerMinute / no token budgets",
        "tokens: reserve under 3 scopes with a token window each / plain reserve",
        "tokens: budgeted cycle on 5,000 attempts / 60 d vs empty (tokensPerMinute)",
    ):
        assert figure in text
    # issue 31: LiteLLM's proxy runs only in full mode; the smoke run says so and needs no litellm
    assert "| gateway: LiteLLM proxy overhead p50 | skipped |" in text
    assert "| gateway: LiteLLM proxy time to first byte - direct (p50) | skipped |" in text
    assert "skipped in --quick mode" in text
    assert "SQLite" in text
    assert "journal mode" in text
    if chosen_journal_mode() == "wal" and not wal_is_safe(sqlite3.sqlite_version):
        # issue 46: the rollback journal's fallback measured beside WAL, in a child process
        assert "ledger cycle / floor (truncate, sqlite3 " in text
    assert "failed" not in text
    if os.environ.get("LEDGER_TEST_PG_URL"):  # issue 16: PostgreSQL beside SQLite
        assert "fleet cycle: PostgreSQL / SQLite" in text
        assert "fleet contention: PostgreSQL / SQLite (2 processes)" in text
        # issue 46 item 4: two services on one database, the hourly budget exact
        assert "fleet-serve: 2 services / 1, total cycles/s" in text
        assert (
            "| fleet-serve: reservations in the hour (database count) vs callsPerHour L=200 "
            "| 200 | 2 rounds | = L exactly | yes |" in text
        )
    else:
        skipped = "| fleet-serve: ledger serve processes on one PostgreSQL database | skipped |"
        assert skipped in text
    assert not list(tmp_path.glob("ledger-bench-*")), "scratch databases are removed"


def test_issue_23_simulate_bench_samples_the_end_of_the_day_inside_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The day drains just before 24:00, so its last quarter is sampled at the last item, not
    after the run, when the whole history has been read back for the report."""
    from bench import simulate
    from bench.common import Settings
    from ledger.simulate.runner import run_policy as real_run_policy

    finished = False

    def run_policy(*args: Any, **kwargs: Any) -> Any:
        nonlocal finished
        record = real_run_policy(*args, **kwargs)
        finished = True
        return record

    monkeypatch.setattr(simulate, "run_policy", run_policy)
    monkeypatch.setattr(simulate, "QUICK_ITEMS", 300)  # the last one arrives at 23:55:12
    monkeypatch.setattr(simulate, "_rss_mib", lambda: 100.0 if finished else 1.0)
    rows = simulate.run(tmp_path, Settings.make(quick=True))
    (memory,) = [row for row in rows if "resident memory" in row.figure]
    assert memory.value == "1, 1, 1, 1 MiB"
    assert "peak" in memory.note


def test_issue33_quick_runs_never_overwrite_the_published_results() -> None:
    """`python -m bench --quick` wrote its smoke numbers over the tracked bench/results.md."""
    assert parse_args([]).out == Path("bench/results.md")
    assert parse_args(["--quick"]).out == Path("bench/results-quick.md")
    assert parse_args(["--quick", "--out", "bench/results.md"]).out == Path("bench/results.md")


def test_issue32_quick_mode_never_installs_snipz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CI smoke run reuses a snipz venv that exists and never creates one: its rows are
    skipped with the reason, and no interpreter is even looked for."""
    from bench import snipz_venv

    cache = tmp_path / "cache"
    monkeypatch.setenv("LEDGER_BENCH_CACHE", str(cache))

    def no_search() -> str | None:
        raise AssertionError("--quick looked for a Python 3.13 to install snipz with")

    monkeypatch.setattr(snipz_venv, "find_python313", no_search)
    python, why = snipz_venv.snipz_python(quick=True)
    assert python is None
    assert "skipped in --quick mode" in why
    assert not cache.exists()


def test_issue32_burst_plan_and_overshoot_are_the_same_for_both_libraries() -> None:
    """Every attempt is made once across the children; usages stay within the estimate; the
    overshoot counts whichever of granted estimates and committed cost went past the limit."""
    from bench import snipz_driver as plan
    from bench.scope_burst import Burst

    for procs, attempts in ((16, 1000), (4, 160), (3, 10)):
        assert sum(plan.attempts_of(n, procs, attempts) for n in range(procs)) == attempts
    tokens = [plan.usage_tokens(n, i) for n in range(16) for i in range(63)]
    assert min(tokens) >= 1
    assert max(tokens) <= plan.REPLY_TOKENS
    assert plan.cost_micro(plan.REPLY_TOKENS) == plan.ESTIMATE_MICRO
    burst = Burst(10, 6, 5_000_100, 4_000_000, 1.0, 1.0, [])
    assert burst.overshoot_usd(5) == pytest.approx(0.0001)
    assert Burst(10, 6, 4_000_000, 5_000_200, 1.0, 1.0, []).overshoot_usd(5) == pytest.approx(
        0.0002
    )
    assert Burst(10, 6, 5_000_000, 4_000_000, 2.0, 1.0, []).overshoot_usd(5) == 0
    assert burst.per_second() == 10


@pytest.mark.slow
def test_issue_31_gateway_ab_runs_two_services_on_two_code_trees(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """bench/gateway_ab (the tool behind the README's A/B table) runs A on a git worktree of
    HEAD and B on the working tree, and removes the worktree afterwards."""
    import subprocess
    import sys
    import tempfile

    from bench import gateway_ab

    def worktrees() -> str:
        listed = subprocess.run(["git", "-C", str(gateway_ab.ROOT), "worktree", "list"],
                                capture_output=True, text=True, check=True)  # fmt: skip
        return listed.stdout

    before = worktrees()
    with tempfile.TemporaryDirectory() as parent, gateway_ab.worktree("HEAD", Path(parent)) as code:
        env = {**os.environ, **gateway_ab.code_env(code)}
        where = subprocess.run([sys.executable, "-c", "import ledger; print(ledger.__file__)"],
                               cwd=gateway_ab.ROOT, env=env, capture_output=True, text=True,
                               check=True)  # fmt: skip
        assert where.stdout.strip() == str(code / "ledger" / "__init__.py")  # not the tree's
    assert gateway_ab.main(["--base", "HEAD", "--pairs", "2"]) == 0
    out = capsys.readouterr().out
    assert "A = HEAD (worktree), B = the working tree; 2 pairs" in out
    assert "paired median" in out
    assert worktrees() == before


def test_r_tok_2_tokens_bench_quick_rows_measure_every_ratio(tmp_path: Path) -> None:
    """The token budgets' figure (SPEC section 22) in its quick form: every ratio is measured
    (a number with its goal), none failed, and the history it compares carries token estimates
    with some usage above them (what R-TOK-3's overrun read must find), and hour totals whose
    attempts are its rows' count (what the rolling hour's count reads, R-RES-1)."""
    import sqlite3 as stdlib_sqlite

    from bench import growth, tokens
    from bench.common import Settings, make_home, open_ledger
    from ledger.clock import now_ms

    rows = [row for row in tokens.run(tmp_path / "tokens", Settings.make(quick=True)) if row.target]
    assert [row.target for row in rows] == ["<= 1.15", "<= 1.25", "<= 1.2", "<= 1.2"]
    for row in rows:
        assert row.figure.startswith("tokens: ")
        assert row.value.endswith("x")
        assert float(row.value[:-1]) > 0
        assert row.met is not None
    home = make_home(tmp_path, "history")
    open_ledger(home).close()
    growth.build_history(home / "ledger.db", 400, now_ms())
    conn = stdlib_sqlite.connect(home / "ledger.db")
    estimates, over = conn.execute(
        "SELECT min(estimate_input_tokens + estimate_output_tokens),"
        " sum(output_tokens > estimate_output_tokens) FROM reservations"
    ).fetchone()
    hours = dict(conn.execute("SELECT hour_start_ms, attempts FROM cost_hours"))
    counted = dict(conn.execute(
        "SELECT created_ms - created_ms % 3600000 AS h, count(*) FROM reservations GROUP BY h"
    ))  # fmt: skip
    conn.close()
    assert hours == counted  # R-RES-1: the rolling hour reads its whole hours from attempts
    assert estimates == sum(growth.ESTIMATE_TOKENS)
    assert over > 0
