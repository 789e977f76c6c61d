"""Figure `tokens` (SPEC section 22): what token-rate budgets add to a reserve.

Three ratios, each side measured alternately in chunks in the same process on the same disk:
- reserve+settle under a model's and its provider's `tokensPerMinute` vs the same cycle on a ledger
  without token budgets;
- a reserve under 3 scopes with a token window each vs a plain reserve on the same ledger (the
  settle untimed, as in figure `scopes`);
- the token-budgeted cycle on a ledger holding a large history (60 days, with token estimates and
  usage, some above the estimate) vs an empty ledger, both with the same token budgets: a minute's
  and a day's window.

Invariant: the limits are so large that nothing is refused; every reserve names the same model, so
every token budget applies to every timed reserve.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import growth
from bench.common import (
    Chunk,
    Row,
    Settings,
    Stats,
    bench_policy,
    make_home,
    open_ledger,
    per_cycle,
    ratio_row,
    side_by_side,
    time_row,
)
from ledger.api import Ledger
from ledger.clock import now_ms
from ledger.records import Success

MODEL = "alpha/m0"
LIMIT = 10**12  # tokens: never refuses
BUDGET_TARGET = 1.15
SCOPES_TARGET = 1.25
GROWTH_TARGET = 1.2
MINUTE_BUDGETS = {MODEL: {"tokensPerMinute": LIMIT}, "alpha": {"tokensPerMinute": LIMIT}}
DAY_BUDGETS = {MODEL: {"tokensPerMinute": LIMIT}, "alpha": {"tokensPerDay": LIMIT}}
SCOPES = {
    "tpm": {"tokensPerMinute": LIMIT},
    "in": {"inputTokensPerMinute": LIMIT},
    "out": {"outputTokensPerMinute": LIMIT},
}
NAMES = tuple(SCOPES)


def _cycle(ledger: Ledger, i: int, sources: int = 1000) -> None:
    """One reserve + settle(success) on MODEL, its usage within the estimate."""
    res = ledger.reserve(f"src-{i % sources}", MODEL, input_bytes=2000)
    ledger.settle(res.id, Success(input_tokens=500, output_tokens=200))


def _cycles(ledger: Ledger) -> Chunk:
    return lambda start, count: per_cycle(lambda i: _cycle(ledger, i), start, count)


def _reserves(ledger: Ledger, scopes: tuple[str, ...], tag: str) -> Chunk:
    """Mean seconds per reserve (its settle untimed) under `scopes`."""

    def chunk(start: int, count: int) -> float:
        spent = 0.0
        for i in range(start, start + count):
            t0 = time.perf_counter()
            res = ledger.reserve(f"{tag}-{i}", MODEL, input_bytes=2000, scopes=scopes)
            spent += time.perf_counter() - t0
            ledger.settle(res.id, Success(input_tokens=500, output_tokens=200))
        return spent / count

    return chunk


def _ratios(firsts: list[float], seconds: list[float]) -> Stats:
    return Stats.of([a / b for a, b in zip(firsts, seconds, strict=True)])


def budgets_vs_plain(root: Path, settings: Settings) -> tuple[list[float], list[float]]:
    """Seconds per reserve+settle under a model's and a provider's tokensPerMinute, and without
    token budgets."""
    budgeted = open_ledger(make_home(root, "budgeted"), bench_policy(tokenBudgets=MINUTE_BUDGETS))
    plain = open_ledger(make_home(root, "plain"))
    try:
        warm = max(3, settings.cycles // 10)
        per_cycle(lambda i: _cycle(budgeted, i), 0, warm)
        per_cycle(lambda i: _cycle(plain, i), 0, warm)
        with_budgets, without = side_by_side(_cycles(budgeted), _cycles(plain), settings, warm)
    finally:
        budgeted.close()
        plain.close()
    return with_budgets, without


def scopes_vs_plain(root: Path, settings: Settings) -> tuple[list[float], list[float]]:
    """Seconds per reserve under 3 scopes with a token window each, and per plain reserve, on
    one ledger."""
    ledger = open_ledger(make_home(root, "scoped"), bench_policy(scopes=SCOPES))
    try:
        warm = max(3, settings.cycles // 10)
        _reserves(ledger, (), "warm-plain")(0, warm)
        _reserves(ledger, NAMES, "warm-scoped")(0, warm)
        plain, scoped = side_by_side(
            _reserves(ledger, (), "plain"), _reserves(ledger, NAMES, "scoped"), settings, warm
        )
    finally:
        ledger.close()
    return scoped, plain


def history_vs_empty(big: Path, empty: Path, settings: Settings, budgets: Any) -> Stats:
    """The budgeted cycle on the big ledger / on the empty one, same policy."""
    policy = bench_policy(tokenBudgets=budgets)
    led_big, led_empty = open_ledger(big, policy), open_ledger(empty, policy)
    try:
        per_cycle(lambda i: _cycle(led_big, i), 0, 5)
        per_cycle(lambda i: _cycle(led_empty, i), 0, 5)
        on_big, on_empty = side_by_side(_cycles(led_big), _cycles(led_empty), settings, 5)
    finally:
        led_big.close()
        led_empty.close()
    return _ratios(on_big, on_empty)


def run(root: Path, settings: Settings) -> list[Row]:
    """The three ratios (the history one with a minute's and with a day's window)."""
    with_budgets, without = budgets_vs_plain(root / "budgets", settings)
    with_scopes, plain = scopes_vs_plain(root / "scopes", settings)
    budgets, scoped = _ratios(with_budgets, without), _ratios(with_scopes, plain)
    big, empty = make_home(root, "history-big"), make_home(root, "history-empty")
    open_ledger(big).close()
    open_ledger(empty).close()
    t0 = time.perf_counter()
    growth.build_history(big / "ledger.db", settings.growth_rows, now_ms())
    built = time.perf_counter() - t0
    minute = history_vs_empty(big, empty, settings, MINUTE_BUDGETS)
    day = history_vs_empty(big, empty, settings, DAY_BUDGETS)
    label = f"{settings.growth_rows:,} attempts / {growth.DAYS} d"
    return [
        time_row("tokens: cycle without token budgets", Stats.of(without)),
        time_row("tokens: cycle under a model's and a provider's tokensPerMinute",
                 Stats.of(with_budgets)),
        ratio_row(
            "tokens: cycle under a model's and a provider's tokensPerMinute / no token budgets",
            budgets, f"<= {BUDGET_TARGET}", budgets.median <= BUDGET_TARGET,
        ),
        time_row("tokens: plain reserve (3-scope ledger)", Stats.of(plain)),
        time_row("tokens: reserve under 3 scopes with a token window each", Stats.of(with_scopes)),
        ratio_row(
            "tokens: reserve under 3 scopes with a token window each / plain reserve",
            scoped, f"<= {SCOPES_TARGET}", scoped.median <= SCOPES_TARGET,
        ),
        ratio_row(
            f"tokens: budgeted cycle on {label} vs empty (tokensPerMinute)",
            minute, f"<= {GROWTH_TARGET}", minute.median <= GROWTH_TARGET,
            note=f"history built in {built:.1f} s",
        ),
        ratio_row(
            f"tokens: same, a provider's tokensPerDay instead ({label})",
            day, f"<= {GROWTH_TARGET}", day.median <= GROWTH_TARGET,
        ),
    ]  # fmt: skip
