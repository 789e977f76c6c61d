"""The trace format (R-SIM-2): a ledger's own history as provider behaviour, never text.

A trace holds, per attempt, when it started (milliseconds after the trace's start), an opaque
source number, the model, the role, how it ended (status, kind, subkind, reason token, late), its
duration, tokens, cost and the provider's hint when one set a cooldown; and per source when it
arrived. Source ids and payload references are not exported (they may name customer data):
sources are numbered in order of arrival. Times are relative so a trace can be replayed from any
start. `format` and `version` let a reader refuse a file it does not understand.

Invariant: building a trace is pure (a `History` in, a `Trace` out); nothing here reads a clock.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ledger.clock import iso
from ledger.simulate.limits import MAX_ENTRIES, InputBytes, SpanMs, TokenCount
from ledger.store.history import History

_WORD = r"^[a-z0-9_.-]{1,64}$"
_MODEL_KEY = r"^[^/\s]{1,100}/[^\s]{1,200}$"
NonNegative = Annotated[int, Field(ge=0, le=10**13)]
Token = Annotated[str, Field(pattern=_WORD)]
ModelKey = Annotated[str, Field(pattern=_MODEL_KEY)]
# Literals, not enums: trace files are validated strictly from JSON (`ledger.validation`).
Role = Literal["primary", "fallback", "correction", "override", "retry"]
Status = Literal["open", "succeeded", "failed", "cancelled", "expired"]
Kind = Literal[
    "auth", "quota", "rate_limit", "transport", "request_rejected", "invalid_output", "safety",
    "write_rejected", "stale", "cancelled", "unknown",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TraceAttempt(_Strict):
    """One recorded attempt: a reservation and how it was settled."""

    at_ms: SpanMs = Field(alias="atMs")
    source: NonNegative
    model: ModelKey
    role: Role = "primary"
    fallback_from: ModelKey | None = Field(None, alias="fallbackFrom")
    status: Status = "succeeded"
    kind: Kind | None = None
    subkind: Token | None = None
    reason: Token | None = None
    late: bool = False
    duration_ms: SpanMs | None = Field(None, alias="durationMs")
    input_bytes: InputBytes | None = Field(None, alias="inputBytes")
    """The request size the reservation was checked with (a size, never the request)."""
    input_tokens: TokenCount | None = Field(None, alias="inputTokens")
    output_tokens: TokenCount | None = Field(None, alias="outputTokens")
    cost_usd: Annotated[float, Field(ge=0, le=1e9)] | None = Field(None, alias="costUsd")
    cost_known: bool = Field(False, alias="costKnown")
    retry_after_ms: SpanMs | None = Field(None, alias="retryAfterMs")


class TraceArrival(_Strict):
    """One source's arrival in the queue."""

    at_ms: SpanMs = Field(alias="atMs")
    source: NonNegative


class Trace(_Strict):
    """A whole trace file."""

    format: Literal["ledger-trace"] = "ledger-trace"
    version: Literal[1] = 1
    start: str | None = None
    """ISO 8601 UTC time of `atMs` 0 (informational; replays start at `startMs`)."""
    start_ms: NonNegative = Field(0, alias="startMs")
    end_ms: SpanMs = Field(0, alias="endMs")
    """Milliseconds after the start at which the recording ended (the export time)."""
    attempts: list[TraceAttempt] = Field(default_factory=list, max_length=MAX_ENTRIES)
    arrivals: list[TraceArrival] = Field(default_factory=list, max_length=MAX_ENTRIES)

    def to_json(self) -> dict[str, object]:
        """The document as written by `ledger trace export --json`."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


def trace_from_history(history: History) -> Trace:
    """The trace of `history`: relative times, numbered sources, no ids, no text."""
    starts = [a.created_ms for a in history.arrivals] + [a.created_ms for a in history.attempts]
    floor = history.since_ms + 1 if history.since_ms >= 0 else None
    start = min(starts) if starts else history.now_ms
    if floor is not None:
        start = max(floor, start) if starts else floor
    numbers: dict[str, int] = {}
    arrivals: list[TraceArrival] = []
    for row in history.arrivals:  # ordered by arrival, then id
        numbers[row.source_id] = len(numbers) + 1
        arrivals.append(TraceArrival(at_ms=max(0, row.created_ms - start), source=len(numbers)))
    attempts = [
        TraceAttempt(
            at_ms=row.created_ms - start,
            source=numbers.get(row.source_id, 0),
            model=row.model,
            role=row.role,
            fallback_from=row.fallback_from,
            status=row.status,
            kind=row.kind,
            subkind=row.subkind,
            reason=row.reason,
            late=row.late,
            duration_ms=row.duration_ms,
            input_bytes=row.input_bytes,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            cost_usd=None if row.cost_micro is None else row.cost_micro / 1_000_000,
            cost_known=row.actual_micro is not None,
            retry_after_ms=_retry_after(row.hint_until_ms, row.settled_ms),
        )
        for row in history.attempts
    ]
    return Trace(
        start=iso(start),
        start_ms=start,
        end_ms=max(0, history.now_ms - start),
        attempts=attempts,
        arrivals=arrivals,
    )


def _retry_after(hint_until_ms: int | None, settled_ms: int | None) -> int | None:
    if hint_until_ms is None or settled_ms is None:
        return None
    return max(0, hint_until_ms - settled_ms)


def trace_schema() -> dict[str, object]:
    """The JSON Schema of trace files."""
    schema = Trace.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ledger trace"
    return schema
