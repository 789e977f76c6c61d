"""R-POL-8: operator durations parse strictly and never echo the input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.clock import (
    MAX_DURATION_MS,
    format_duration_ms,
    human_duration_ms,
    parse_duration_ms,
)
from ledger.errors import UsageError


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("250ms", 250),
        ("1ms", 1),
        ("90s", 90_000),
        ("30m", 1_800_000),
        ("2h", 7_200_000),
        ("1h30m", 5_400_000),
        ("2d", 172_800_000),
        ("1d2h3m4s5ms", 93_784_005),
        ("1m30s", 90_000),
        ("1s500ms", 1_500),
        ("0h5m", 300_000),
        ("366d", MAX_DURATION_MS),
        ("8784h", MAX_DURATION_MS),
    ],
)
def test_r_pol_8_valid_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0s",
        "0h0m",
        "10",
        "h",
        "1.5h",
        "-5m",
        "+5m",
        "1h 30m",
        " 1h",
        "1h\n",
        "30m1h",
        "1h1h",
        "5ms1s",
        "1w",
        "1H",
        "1hour",
        "367d",
        "8785h",
        "9999999999999d",
        "\u0661h",  # Arabic-Indic digit one: only ASCII digits count
        "secret-token-abc",
    ],
)
def test_r_pol_8_invalid_durations_never_echo_input(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_duration_ms(text)
    assert info.value.message == _fixed_message()
    assert "secret-token-abc" not in info.value.message


def _fixed_message() -> str:
    with pytest.raises(UsageError) as info:
        parse_duration_ms("x")
    return info.value.message


@given(st.text(max_size=40))
def test_r_pol_8_garbage_raises_usage_error_only(text: str) -> None:
    message: str | None = None
    ms = 0
    try:
        ms = parse_duration_ms(text)
    except UsageError as exc:
        message = exc.message
    assert message == _fixed_message() if message is not None else 0 < ms <= MAX_DURATION_MS


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (45_000, "45s"),
        (5_400_000, "1h30m"),
        (90_000, "1m30s"),
        (250, "250ms"),
        (172_800_000, "2d"),
        (93_784_005, "1d2h3m4s5ms"),
        (-60_000, "-1m"),
    ],
)
def test_r_pol_8_format_duration(ms: int, text: str) -> None:
    assert format_duration_ms(ms) == text


@given(st.integers(min_value=1, max_value=MAX_DURATION_MS))
def test_r_pol_8_format_round_trips(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (388, "388ms"),
        (59_388, "59s"),
        (4 * 60_000 + 59_622, "4m59s"),
        (2 * 3_600_000 - 612, "1h59m"),  # issue 20 item 15: not 1h59m59s388ms
        (7_200_000, "2h"),
        (3_600_000 + 30_000, "1h"),  # the unit below the hour is zero: nothing finer shown
        (93_784_005, "1d2h"),
        (-90_500, "-1m30s"),
    ],
)
def test_issue20_item15_human_duration_two_units(ms: int, text: str) -> None:
    assert human_duration_ms(ms) == text


@given(st.integers(min_value=1, max_value=MAX_DURATION_MS))
def test_issue20_item15_human_duration_never_overstates(ms: int) -> None:
    # a shown time left is never more than what is left, and within one unit of the second place
    shown = parse_duration_ms(human_duration_ms(ms))
    assert shown <= ms
    assert len(human_duration_ms(ms)) <= 7
