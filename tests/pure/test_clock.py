"""The clock seam's text form: ISO times the service and the CLI print read back to the same ms."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.clock import iso, parse_iso_ms


def test_issue_21_iso_is_exact_where_float_seconds_round_wrong() -> None:
    assert iso(16331841791897) == "2487-07-14T22:43:11.897Z"  # ms/1000 as a float gave .896


@settings(max_examples=500)
@given(st.integers(min_value=0, max_value=2**46))
def test_issue_21_iso_round_trips_every_millisecond(ms: int) -> None:
    assert parse_iso_ms(iso(ms)) == ms
    assert parse_iso_ms(None) is None
