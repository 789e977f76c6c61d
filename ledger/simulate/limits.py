"""The documented limits of simulation inputs (R-SIM-4) and the field types that enforce them.

Invariant: a value outside a limit is refused while the file is read, as one line naming the
file, the field and the rule (`ledger.validation`'s `rule:` convention), never the value; what
passes is inside what the ledger itself accepts (request sizes, token counts) and inside the
longest span a simulation replays.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from ledger.arguments import MAX_INPUT_BYTES
from ledger.records import MAX_TOKENS

DAY_MS = 86_400_000
MAX_SPAN_DAYS = 31
MAX_SPAN_MS = MAX_SPAN_DAYS * DAY_MS
"""The longest span of virtual time a trace or scenario may describe (a scenario's `hours` at
most 744), and the longest `--drain-for`."""


def _at_most(limit: int, why: str) -> AfterValidator:
    def check(value: int) -> int:
        if value > limit:
            raise ValueError(f"rule: must be at most {limit} ({why})")
        return value

    return AfterValidator(check)


SpanMs = Annotated[
    int,
    Field(ge=0, json_schema_extra={"maximum": MAX_SPAN_MS}),
    _at_most(MAX_SPAN_MS, f"{MAX_SPAN_DAYS} days in ms: the longest span a simulation replays"),
]
"""A time or duration inside a trace, in ms after its start."""
MAX_ENTRIES = 2_000_000
"""The most attempts, and the most arrivals, a trace may hold (streamed: `bench/simulate.py`
measures the memory a trace this large needs)."""
InputBytes = Annotated[
    int,
    Field(ge=0, json_schema_extra={"maximum": MAX_INPUT_BYTES}),
    _at_most(MAX_INPUT_BYTES, "the largest request size the ledger accepts"),
]
TokenCount = Annotated[
    int,
    Field(ge=0, json_schema_extra={"maximum": MAX_TOKENS}),
    _at_most(MAX_TOKENS, "the largest token count the ledger accepts"),
]
