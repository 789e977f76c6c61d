"""R-DB-6: compaction folds old attempts into daily totals without changing any budget."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from ledger.api import Ledger
from ledger.budgets.checks import SourceBudget
from ledger.classify import classify_kind
from ledger.cli.main import cli
from ledger.errors import Refused, UsageError
from ledger.records import Cancelled, Failed, Success
from ledger.store import reads
from ledger.store.compact import compact, compact_step, utc_day
from ledger.store.schema import daily_totals, reservations, sources
from tests.support.ledgers import Clock, LedgerFactory

HOUR = 3_600_000
DAY = 24 * HOUR
POLICY = {"sourceCalls": 4, "sourceModels": 2, "sourceTimeMs": 50_000, "timeoutMs": 20_000}


def budgets(led: Ledger) -> dict[str, SourceBudget]:
    with led.db.read() as conn:
        ids = [r.id for r in conn.execute(select(sources.c.id))]
        found = {sid: reads.source_budget(conn, sid) for sid in ids}
    return {sid: b for sid, b in found.items() if b is not None}


def reservation_rows(led: Ledger) -> list[dict[str, object]]:
    with led.db.read() as conn:
        return [dict(r._mapping) for r in conn.execute(select(reservations))]


def totals(led: Ledger) -> dict[tuple[str, str], dict[str, int]]:
    with led.db.read() as conn:
        return {
            (r.day, r.model_key): {
                k: v for k, v in r._mapping.items() if k not in {"day", "model_key"}
            }
            for r in conn.execute(select(daily_totals))
        }


def refusal(led: Ledger, source: str, model: str) -> str | None:
    try:
        res = led.reserve(source, model)
    except Refused as error:
        return error.reason
    led.settle(res.id, Cancelled())
    return None


def history(led: Ledger, clock: Clock) -> None:
    """Sources at each of their caps, plus a mixed one; every outcome kind and an expiry."""
    for _ in range(4):  # s-calls: at sourceCalls
        r = led.reserve("s-calls", "alpha/small")
        clock.advance(100)
        led.settle(r.id, Success(10, 5))
    r = led.reserve("s-models", "alpha/small")  # s-models: two models
    led.settle(r.id, Success(10, 5))
    r = led.reserve("s-models", "beta/mid")
    clock.advance(50)
    led.settle(r.id, Failed(classify_kind("unknown")))
    for _ in range(3):  # s-time: 3 x 20 s allowance, two expired open
        led.reserve("s-time", "beta/free/unknown")
    clock.advance(25_000)
    r = led.reserve("s-mixed", "alpha/small")
    led.settle(r.id, Cancelled())
    r = led.reserve("s-mixed", "beta/mid")
    clock.advance(1_500)
    led.settle(r.id, Success(1000, 500, cost_usd=0.25))


PROBES = [
    ("s-calls", "alpha/small"),
    ("s-models", "alpha/big"),
    ("s-time", "beta/free/unknown"),
]


def test_r_db_6_per_source_budgets_identical_after_compaction(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(**POLICY)
    history(led, clock)
    clock.advance(31 * DAY)
    before = budgets(led)
    reasons = [refusal(led, s, m) for s, m in PROBES]
    assert reasons == ["source_calls", "source_models", "source_time"]
    summary = compact(led.db, clock.ms, 30 * DAY)
    assert summary.folded == 11
    assert reservation_rows(led) == []
    assert budgets(led) == before
    assert [refusal(led, s, m) for s, m in PROBES] == reasons
    with led.db.read() as conn:
        models = conn.execute(select(sources.c.id)).all()
    assert len(models) == 4  # sources are kept, with their source_models rows


def _random_history(led: Ledger, clock: Clock, seed: int) -> None:
    rng = random.Random(seed)
    models = ["alpha/small", "alpha/big", "beta/mid", "beta/free/unknown"]
    for i in range(40):
        source = f"src-{rng.randrange(8)}-{i // 4}"
        clock.advance(rng.randrange(1, 4 * HOUR))
        try:
            res = led.reserve(source, rng.choice(models), input_bytes=rng.randrange(5000))
        except Refused:  # a failure's backoff: history goes on with other sources
            continue
        clock.advance(rng.randrange(1, 30_000))
        kind = rng.randrange(4)
        if kind == 0:
            write, read = rng.randrange(50), rng.randrange(500)
            usage = Success(rng.randrange(900), rng.randrange(300), cache_write_tokens=write,
                            cache_read_tokens=read)  # fmt: skip
            led.settle(res.id, usage)
        elif kind == 1:
            led.settle(res.id, Failed(classify_kind("unknown"), input_tokens=7))
        elif kind == 2:
            led.settle(res.id, Cancelled())
        # kind 3: left open; expires at its deadline


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_r_db_6_daily_totals_sum_the_folded_rows(
    make_ledger: LedgerFactory, clock: Clock, seed: int
) -> None:
    led = make_ledger(callsPerHour=1000, sourceCalls=1000, sourceModels=10, sourceTimeMs=10**9)
    _random_history(led, clock, seed)
    clock.advance(2 * DAY)
    cutoff = clock.ms - 3 * DAY
    with led.db.write() as txn:  # what any reserve would do first: expire overdue rows
        from ledger.store.reservations import expire_open

        expire_open(txn.conn, txn.now)
    rows = [r for r in reservation_rows(led) if int(r["created_ms"]) < cutoff]  # type: ignore[call-overload]
    assert rows
    expected: dict[tuple[str, str], dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(
            [
                "attempts",
                "succeeded",
                "failed",
                "cancelled",
                "expired",
                "input_tokens",
                "output_tokens",
                "cost_micro",
                "unknown_cost",
                "cache_write_tokens",
                "cache_read_tokens",
            ],
            0,
        )
    )
    for r in rows:
        e = expected[(utc_day(int(r["created_ms"])), str(r["model_key"]))]  # type: ignore[call-overload]
        e["attempts"] += 1
        e[str(r["status"])] += 1
        e["input_tokens"] += int(r["input_tokens"] or 0)  # type: ignore[call-overload]
        e["output_tokens"] += int(r["output_tokens"] or 0)  # type: ignore[call-overload]
        e["cache_write_tokens"] += int(r["cache_write_tokens"] or 0)  # type: ignore[call-overload]
        e["cache_read_tokens"] += int(r["cache_read_tokens"] or 0)  # type: ignore[call-overload]
        if r["cost_micro"] is None:
            e["unknown_cost"] += 1
        else:
            e["cost_micro"] += int(r["cost_micro"])  # type: ignore[call-overload]
    before = budgets(led)
    folded = 0
    while step := compact_step(led.db, clock.ms, 3 * DAY, batch=3):  # many small batches
        folded += step
    assert folded == len(rows)
    assert totals(led) == dict(expected)
    assert budgets(led) == before


def test_r_db_6_nothing_inside_24h_is_touched(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger(timeoutMs=10 * DAY, sourceTimeMs=20 * DAY)
    old = led.reserve("old", "alpha/small")
    led.settle(old.id, Success(1, 1))
    still_open = led.reserve("open-long", "alpha/small")  # open, deadline not yet passed
    clock.advance(DAY + HOUR)
    recent = led.reserve("recent", "alpha/small")
    led.settle(recent.id, Success(1, 1))
    clock.advance(DAY - 2 * HOUR)  # `recent` is 22 h old, `old` 47 h
    assert compact_step(led.db, clock.ms, DAY) == 1
    left = {int(r["id"]) for r in reservation_rows(led)}  # type: ignore[call-overload]
    assert left == {still_open.id, recent.id}
    assert compact_step(led.db, clock.ms, DAY) == 0


@pytest.mark.parametrize("age", [0, 1, DAY - 1])
def test_r_db_6_cutoff_shorter_than_24h_refused(
    make_ledger: LedgerFactory, clock: Clock, age: int
) -> None:
    led = make_ledger()
    with pytest.raises(UsageError):
        compact_step(led.db, clock.ms, age)
    with pytest.raises(UsageError):
        compact(led.db, clock.ms, age)


def test_r_db_6_idempotent(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger(**POLICY)
    history(led, clock)
    clock.advance(40 * DAY)
    first = compact(led.db, clock.ms, 30 * DAY, batch=5)
    after_first = (totals(led), budgets(led), reservation_rows(led))
    second = compact(led.db, clock.ms, 30 * DAY, batch=5)
    assert first.folded == 11
    assert first.batches == 3
    assert second.folded == 0
    assert (totals(led), budgets(led), reservation_rows(led)) == after_first


def test_r_db_6_cli_compact(home: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["--home", str(home), "db", "compact", "--older-than", "23h"])
    assert result.exit_code == 2, result.output
    assert "24h" in result.output
    result = runner.invoke(cli, ["--home", str(home), "db", "compact", "--older-than", "bogus"])
    assert result.exit_code == 2
    result = runner.invoke(cli, ["--home", str(home), "db", "compact", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["folded"] == 0
    result = runner.invoke(cli, ["--home", str(home), "db", "compact", "--older-than", "24h"])
    assert result.exit_code == 0, result.output
    assert "folded 0 attempts" in result.output


def test_r_db_6_overdue_open_rows_fold_as_expired(make_ledger: LedgerFactory, clock: Clock) -> None:
    led = make_ledger()
    led.reserve("crashed-worker", "alpha/small")  # never settled; nothing reserved since
    clock.advance(31 * DAY)
    before = budgets(led)
    assert compact_step(led.db, clock.ms, 30 * DAY) == 1
    assert [t["expired"] for t in totals(led).values()] == [1]
    assert budgets(led) == before


def test_r_db_6_worker_drain_compacts_a_bounded_batch(tmp_path: Path) -> None:
    """The worker folds old history in bounded steps as it drains (automatic retention)."""
    from ledger.catalog import Catalog
    from ledger.store.views import source_detail
    from ledger.worker.drain import drain
    from ledger.worker.handler import echo_handler
    from tests.support.ledgers import TEST_CATALOG, Clock

    clock = Clock()
    led = Ledger.open(tmp_path, catalog=Catalog.model_validate(TEST_CATALOG), env={}, clock=clock)
    led.settle(led.reserve("old", "alpha/small").id, Success())
    clock.advance(31 * 24 * 3_600_000)
    drain(led, echo_handler)  # nothing queued: only the compaction step runs
    detail = source_detail(led.db, "old")
    assert detail is not None
    assert detail["attempts"] == []
    assert detail["budget"].calls == 1  # carried over, no budget changes
    led.close()
