"""R-TOK-4: the rate-limit headers of a provider's answer, parsed as numbers, durations and
RFC 3339 times only (classify's bounded parsers); anything else is ignored, never an exception."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.errors import UsageError
from ledger.learned import (
    HORIZON_MS,
    NAMES,
    LearnedLimit,
    LearnedLimits,
    LimitKind,
    read_limits,
)

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z


def _openai(remaining: str, reset: str, limit: str | None = None) -> dict[str, str]:
    out = {"x-ratelimit-remaining-tokens": remaining, "x-ratelimit-reset-tokens": reset}
    if limit is not None:
        out["x-ratelimit-limit-tokens"] = limit
    return out


@pytest.mark.parametrize(
    ("reset", "after_ms"),
    [("6m0s", 360_000), ("20s", 20_000), ("1.5s", 1_500), ("120ms", 120), ("1m30.5s", 90_500),
     ("2027-01-15T08:00:30Z", 30_000), ("2027-01-15T09:00:30+01:00", 30_000),
     ("2027-01-15T08:00:00.250Z", 250)],
)  # fmt: skip
def test_r_tok_4_durations_and_timestamps_are_read(reset: str, after_ms: int) -> None:
    found = read_limits(_openai("1200", reset, "30000"), NOW)
    assert found == LearnedLimits(NOW, (LearnedLimit(LimitKind.TOKENS, 1200, NOW + after_ms,
                                                     30000),))  # fmt: skip


def test_r_tok_4_anthropic_families_give_each_kind() -> None:
    at = "2027-01-15T08:01:00Z"
    headers = {}
    for family, remaining in (("tokens", "900"), ("input-tokens", "800"), ("output-tokens", "70")):
        headers[f"anthropic-ratelimit-{family}-remaining"] = remaining
        headers[f"anthropic-ratelimit-{family}-reset"] = at
        headers[f"anthropic-ratelimit-{family}-limit"] = "1000"
    found = read_limits(headers, NOW)
    assert found is not None
    assert [(x.kind, x.remaining, x.reset_at_ms) for x in found.limits] == [
        (LimitKind.TOKENS, 900, NOW + 60_000),
        (LimitKind.INPUT_TOKENS, 800, NOW + 60_000),
        (LimitKind.OUTPUT_TOKENS, 70, NOW + 60_000),
    ]
    assert found.to_json()["limits"][2] == {
        "kind": "output_tokens", "remaining": 70, "reset_at_ms": NOW + 60_000, "limit": 1000
    }


def test_r_tok_4_names_are_matched_without_case_on_an_httpx_answer() -> None:
    headers = httpx.Headers({"X-RateLimit-Remaining-Tokens": "5", "X-RateLimit-Reset-Tokens": "1s"})
    found = read_limits(headers, NOW)
    assert found is not None
    assert found.limits[0].remaining == 5


def test_r_tok_4_one_name_twice_with_two_values_is_not_read() -> None:
    headers = {"X-RateLimit-Remaining-Tokens": "5", "x-ratelimit-remaining-tokens": "9000",
               "x-ratelimit-reset-tokens": "1s"}  # fmt: skip
    assert read_limits(headers, NOW) is None
    joined = httpx.Headers([("x-ratelimit-remaining-tokens", "5"),
                            ("x-ratelimit-remaining-tokens", "9000"),
                            ("x-ratelimit-reset-tokens", "1s")])  # fmt: skip
    assert read_limits(joined, NOW) is None  # httpx joins them: `5, 9000` is no number


def test_r_tok_4_two_families_for_one_kind_keep_the_smaller_remaining() -> None:
    headers = {**_openai("500", "10s"), "anthropic-ratelimit-tokens-remaining": "300",
               "anthropic-ratelimit-tokens-reset": "2027-01-15T08:00:20Z"}  # fmt: skip
    found = read_limits(headers, NOW)
    assert found is not None
    assert found.limits == (LearnedLimit(LimitKind.TOKENS, 300, NOW + 20_000),)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        _openai("1200", ""),  # no reset: nothing to end it
        {"x-ratelimit-remaining-tokens": "1200"},
        {"x-ratelimit-reset-tokens": "20s"},
        _openai("-5", "20s"),  # negative
        _openai("1e3", "20s"),  # not a whole number
        _openai("12.5", "20s"),
        _openai("99999999999999", "20s"),  # absurdly large
        _openai(str(10**12 + 1), "20s"),
        _openai("0x10", "20s"),
        _openai("1200", "20"),  # a bare number is no duration
        _openai("1200", "-20s"),
        _openai("1200", "0s"),  # resets now: nothing left to keep
        _openai("1200", "25h"),  # beyond the horizon (a day)
        _openai("1200", "999999h"),
        _openai("1200", "inf"),
        _openai("1200", "2027-01-15T07:59:00Z"),  # in the past
        _openai("1200", "2027-02-15T08:00:00Z"),  # a month away
        _openai("1200", "2027-13-40T99:00:00Z"),  # no such time
        _openai("1200", "Fri, 15 Jan 2027 08:00:20 GMT"),  # an HTTP-date is not RFC 3339
        _openai("1200", "20s" * 40),  # too long
        _openai("1200", "20s", "1000"),  # more remaining than the limit: garbage
        _openai("1200", "20s", "-1"),  # a bad limit is ignored
        _openai("\uff11\uff12\uff10\uff10", "20s"),  # fullwidth digits
        _openai("1200", "\uff12\uff10s"),
        _openai("1200\x00", "20s"),
    ],
)
def test_r_tok_4_bad_values_are_ignored(headers: dict[str, str]) -> None:
    found = read_limits(headers, NOW)
    if headers.get("x-ratelimit-limit-tokens") == "-1":  # the limit is optional: kept without it
        assert found is not None
        assert found.limits[0].limit is None
        return
    assert found is None


class _Hostile(Mapping[str, str]):
    def __getitem__(self, key: str) -> str:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        return 1

    def get(self, key: str, default: Any = None) -> Any:
        raise RuntimeError("boom")


def test_r_tok_4_a_hostile_mapping_or_wrong_types_never_raise() -> None:
    assert read_limits(_Hostile(), NOW) is None
    weird: Any = {"x-ratelimit-remaining-tokens": 1200, "x-ratelimit-reset-tokens": b"20s"}
    assert read_limits(weird, NOW) is None
    assert read_limits(None, NOW) is None  # type: ignore[arg-type]


@given(st.dictionaries(st.sampled_from(sorted(NAMES)), st.text(max_size=80), max_size=12))
def test_r_tok_4_any_values_parse_or_are_ignored(headers: dict[str, str]) -> None:
    found = read_limits(headers, NOW)
    if found is not None:  # whatever is kept is plausible
        for one in found.limits:
            assert 0 <= one.remaining <= 10**12
            assert NOW < one.reset_at_ms <= NOW + HORIZON_MS


@pytest.mark.parametrize(
    "limits",
    [
        (LearnedLimit(LimitKind.TOKENS, -1, NOW + 1),),
        (LearnedLimit(LimitKind.TOKENS, 10**13, NOW + 1),),
        (LearnedLimit(LimitKind.TOKENS, 1, NOW),),  # resets when read
        (LearnedLimit(LimitKind.TOKENS, 1, NOW + HORIZON_MS + 1),),
        (LearnedLimit(LimitKind.TOKENS, 1, NOW + 1), LearnedLimit(LimitKind.TOKENS, 2, NOW + 1)),
        (),
        (LearnedLimit("tokens", 1, NOW + 1),),  # type: ignore[arg-type]
        (LearnedLimit(LimitKind.TOKENS, True, NOW + 1),),
    ],
)
def test_r_tok_4_implausible_readings_are_refused_as_usage(
    limits: tuple[LearnedLimit, ...],
) -> None:
    with pytest.raises(UsageError):
        LearnedLimits(NOW, limits)
