"""Token estimates, context fit and input planning (R-SEL-8)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.catalog import Model
from ledger.tokens import CJK_RANGES, estimate_tokens, fits, plan_input, tokens_for_bytes


def model(window: int | None = None, max_output: int | None = None) -> Model:
    data: dict[str, Any] = {"provider": "p", "id": "m"}
    if window is not None:
        data["contextWindow"] = window
    if max_output is not None:
        data["maxOutputTokens"] = max_output
    return Model.model_validate(data)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("abc", 1),
        ("abcd", 2),  # ⌈4 / 3⌉
        ("é", 1),  # 2 bytes
        ("😀", 2),  # 4 bytes, not CJK
        ("日本語", 3),  # CJK Unified Ideographs
        ("こんにちは", 5),  # Hiragana
        ("カタカナ", 4),  # Katakana
        ("한국어", 3),  # Hangul Syllables
        ("。「」", 3),  # CJK Symbols and Punctuation
        ("\uff21\uff22", 2),  # Fullwidth Forms
        ("\U00020000", 1),  # Extension B (4 bytes, still one token)
        ("\U0001b000\U0001b001\U0001b002", 3),  # Kana Supplement: 12 bytes, not ⌈12 / 3⌉ + 1
        ("\U0001f600\U0001f600\U0001f600", 4),  # emoji are not CJK: ⌈12 / 3⌉
        ("日本a", 3),  # 2 CJK + ⌈1 / 3⌉
        ("日abc本def", 4),  # CJK is removed, other bytes pooled: 2 + ⌈6 / 3⌉
    ],
)
def test_r_sel_8_estimate_tokens(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


@pytest.mark.parametrize(("lo", "hi"), CJK_RANGES)
def test_r_sel_8_cjk_range_bounds_count_one_token(lo: int, hi: int) -> None:
    for code_point in (lo, hi):
        char = chr(code_point)
        assert estimate_tokens(char) == 1
        assert len(char.encode()) >= 3  # why tokens_for_bytes stays an upper bound


@given(st.text())
def test_r_sel_8_tokens_for_bytes_bounds_the_estimate(text: str) -> None:
    assert tokens_for_bytes(len(text.encode())) >= estimate_tokens(text)


@given(st.text(), st.text())
def test_r_sel_8_estimate_is_subadditive(a: str, b: str) -> None:
    # plan_input sums per-part estimates; that must never undercount the joined text
    assert estimate_tokens(a + b) <= estimate_tokens(a) + estimate_tokens(b)


@pytest.mark.parametrize(("size", "tokens"), [(0, 0), (1, 1), (3, 1), (4, 2), (9000, 3000)])
def test_r_sel_8_tokens_for_bytes(size: int, tokens: int) -> None:
    assert tokens_for_bytes(size) == tokens


def test_tokens_for_bytes_rejects_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        tokens_for_bytes(-1)


@pytest.mark.parametrize(
    ("window", "max_output", "reply", "tokens", "expected"),
    [
        (None, None, 4096, 10**9, True),  # unknown window stays eligible
        (1000, 200, 4096, 800, True),  # reservation = min(200, 4096)
        (1000, 200, 4096, 801, False),
        (1000, None, 300, 700, True),  # unknown ceiling: replyTokens
        (1000, None, 300, 701, False),
        (8192, 8192, 4096, 4096, True),  # ceiling = whole window: replyTokens keeps it usable
        (8192, 8192, 4096, 4097, False),
    ],
)
def test_r_sel_8_fits(
    window: int | None, max_output: int | None, reply: int, tokens: int, expected: bool
) -> None:
    assert fits(model(window, max_output), tokens, reply) is expected


def test_r_sel_8_plan_keeps_everything_that_fits() -> None:
    plan = plan_input("req", ["aaa", "bbb"], model(100, 10), 10)
    assert (plan.kept, plan.dropped, plan.tokens, plan.fits) == ((0, 1), (), 3, True)


def test_r_sel_8_plan_drops_lowest_priority_first() -> None:
    # budget 90 - 10 = 80 tokens; required 30, items 30/30/30 (index 0 most important)
    items = ["a" * 90, "b" * 90, "c" * 90]
    plan = plan_input("r" * 90, items, model(90, 10), 4096)
    assert plan.kept == (0,)
    assert plan.dropped == (1, 2)
    assert plan.tokens == 60
    assert plan.fits


def test_r_sel_8_plan_keeps_a_prefix_even_if_a_later_item_is_small() -> None:
    # budget 90: c (1 token) would fit beside item 0, but it never outlives a higher priority
    plan = plan_input("", ["a" * 150, "b" * 150, "c"], model(100, 10), 4096)
    assert plan.kept == (0,)
    assert plan.dropped == (1, 2)


def test_r_sel_8_plan_rejects_when_required_alone_cannot_fit() -> None:
    plan = plan_input("日" * 81, ["x"], model(90, 10), 4096)
    assert not plan.fits
    assert plan.kept == ()
    assert plan.dropped == (0,)
    assert plan.tokens == 81  # the required part is reported, never truncated


def test_r_sel_8_plan_with_unknown_window_keeps_all() -> None:
    plan = plan_input("x" * 10**6, ["y" * 10**6], model(), 4096)
    assert plan.fits
    assert plan.kept == (0,)


@given(
    required=st.text(max_size=60),
    items=st.lists(st.text(max_size=60), max_size=8),
    window=st.integers(1, 120),
    max_output=st.integers(1, 40),
)
def test_r_sel_8_plan_is_a_maximal_fitting_prefix(
    required: str, items: list[str], window: int, max_output: int
) -> None:
    m = model(window, max_output)
    plan = plan_input(required, items, m, 4096)
    assert plan.kept + plan.dropped == tuple(range(len(items)))
    if not plan.fits:
        assert not fits(m, estimate_tokens(required), 4096)
        assert plan.kept == ()
        return
    expected = estimate_tokens(required) + sum(estimate_tokens(items[i]) for i in plan.kept)
    assert plan.tokens == expected
    assert fits(m, plan.tokens, 4096)
    if plan.dropped:  # keeping the next item would not have fit
        assert not fits(m, plan.tokens + estimate_tokens(items[plan.dropped[0]]), 4096)
