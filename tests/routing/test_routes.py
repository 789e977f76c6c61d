"""Route rules (R-SEL-9): anchored globs over model keys; deny wins; a non-empty allow admits."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.config import RouteRules
from ledger.globs import glob_to_regex, matches
from ledger.routing.rules import route_allowed


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        # `*` spans `/`
        ("openai/*", "openai/gpt-4.1", True),
        ("openai/*", "openai/org/model/v2", True),
        ("*", "any/thing/at/all", True),
        ("*/gpt-*", "openrouter/openai/gpt-4o", True),
        ("openai/*", "openai/", True),  # `*` may match nothing
        # `?` is exactly one character (a `/` included)
        ("openai/gpt-4?", "openai/gpt-4o", True),
        ("openai/gpt-4?", "openai/gpt-4", False),
        ("openai/gpt-4?", "openai/gpt-4oo", False),
        ("openai?gpt", "openai/gpt", True),
        # regex metacharacters are literal
        ("openai/gpt-4.1", "openai/gpt-4x1", False),
        ("openai/gpt-4.1", "openai/gpt-4.1", True),
        ("a+b", "aab", False),
        ("a+b", "a+b", True),
        ("(x)|y", "y", False),
        ("(x)|y", "(x)|y", True),
        ("[ab]", "a", False),
        ("[ab]", "[ab]", True),
        ("a\\d{2}", "a\\d{2}", True),
        ("a\\d{2}", "a12", False),
        ("^a$", "^a$", True),
        # anchored at both ends
        ("openai", "openai/gpt", False),
        ("gpt", "openai/gpt", False),
        ("gpt*", "openai/gpt-4", False),
        ("*gpt", "openai/gpt", True),
        ("*gpt", "openai/gpt-4", False),
        ("openai/gpt", "openai/gpt\n", False),
    ],
)
def test_r_sel_9_glob(pattern: str, key: str, expected: bool) -> None:
    assert matches(key, pattern) is expected


def _reference_match(pattern: str, key: str) -> bool:
    """Plain dynamic-programming glob matcher, the oracle for the regex translation."""

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(key)
        if pattern[i] == "*":
            return match(i + 1, j) or (j < len(key) and match(i, j + 1))
        if j < len(key) and pattern[i] in ("?", key[j]):
            return match(i + 1, j + 1)
        return False

    return match(0, 0)


@given(st.text("ab/.*?", max_size=10), st.text("ab/.", max_size=12))
def test_r_sel_9_glob_agrees_with_reference_matcher(pattern: str, key: str) -> None:
    assert matches(key, pattern) is _reference_match(pattern, key)


@pytest.mark.timeout(10)
def test_r_sel_9_glob_has_no_catastrophic_backtracking() -> None:
    # a naive `.*a.*a...` translation takes exponential time here
    assert not matches("a" * 300, "*a" * 140 + "*b")
    assert not matches("a" * 300, "*a?" * 90 + "*b")


def test_r_sel_9_compiled_patterns_are_cached() -> None:
    assert glob_to_regex("cached/*") is glob_to_regex("cached/*")


@pytest.mark.parametrize(
    ("allow", "deny", "key", "expected"),
    [
        ([], [], "openai/gpt-4o", True),  # no rules: everything allowed
        ([], ["openai/*"], "openai/gpt-4o", False),
        ([], ["openai/*"], "anthropic/claude", True),
        (["openai/*"], [], "openai/gpt-4o", True),
        (["openai/*"], [], "anthropic/claude", False),  # non-empty allow admits only matches
        (["openai/*"], ["openai/gpt-4o"], "openai/gpt-4o", False),  # deny wins
        (["*"], ["*mini"], "openai/gpt-4o-mini", False),
        (["*"], ["*mini"], "openai/gpt-4o", True),
    ],
)
def test_r_sel_9_route_allowed(allow: list[str], deny: list[str], key: str, expected: bool) -> None:
    assert route_allowed(key, RouteRules(allow=allow, deny=deny)) is expected
