"""Reading simulation inputs: a trace or a scenario file (told apart by their `format` key).

A scenario is small (at most `MAX_SCENARIO_BYTES`) and is parsed whole. A trace may be large:
it is parsed once, streamed (`ijson`), each attempt and arrival validated on its own and handed
to a `TraceRecorder`, which keeps a few machine words per attempt; the document is never held
in memory as JSON or as models (R-SIM-4: memory bounded by the documented input limits).

Invariant: bad input is one ConfigError line naming the file, the field path and the rule, never
a value (`ledger.validation`); nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import ijson  # streamed JSON: a trace is parsed once, never held whole (see the docstring)

from ledger.errors import ConfigError
from ledger.simulate.limits import MAX_ENTRIES
from ledger.simulate.scenario import (
    SCENARIO_FORMAT,
    SPAN_RULE,
    Scenario,
    arrival_outside_span,
    scenario_workload,
)
from ledger.simulate.trace import Trace, TraceArrival, TraceAttempt
from ledger.simulate.workload import ReplayMode, TraceRecorder, Workload
from ledger.validation import validate_document

MAX_INPUT_BYTES = 512 * 1024 * 1024
"""The largest trace file read (about 1.9 million attempts as `ledger trace export` writes them)."""
MAX_SCENARIO_BYTES = 4 * 1024 * 1024
"""The largest scenario file: a scenario is parsed whole (10,000 windows fit in 2 MB)."""

_LISTS = {"attempts": TraceAttempt, "arrivals": TraceArrival}
_OPEN = frozenset({"start_map", "start_array"})
_CLOSE = frozenset({"end_map", "end_array"})


def load_workload(path: Path, seed: int, replay: ReplayMode = "time") -> Workload:
    """The workload a trace or scenario file describes."""
    file = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_INPUT_BYTES:
            raise ConfigError(file, "(file)", f"is too large (at most {MAX_INPUT_BYTES} bytes)")
        with path.open("rb") as stream:
            if size <= MAX_SCENARIO_BYTES:
                return _small(stream.read(), file, seed, replay)
            return _streamed(stream, file, replay)
    except FileNotFoundError as exc:
        raise ConfigError(file, "(file)", "does not exist") from exc
    except OSError as exc:
        raise ConfigError(file, "(file)", "cannot be read") from exc


def _small(text: bytes, file: str, seed: int, replay: ReplayMode) -> Workload:
    """A file small enough to parse whole: a scenario, or a small trace (recorded the same way
    as a streamed one, item by item)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:  # the parser's fixed text, never the document's
        why = exc.msg.removesuffix(" at").lower()
        where = f"line {exc.lineno}, column {exc.colno}"
        raise ConfigError(file, where, f"is not valid JSON ({why})") from exc
    except (ValueError, RecursionError) as exc:
        raise ConfigError(file, "(top level)", "is not valid JSON") from exc
    if isinstance(raw, dict) and raw.get("format") == SCENARIO_FORMAT:
        scenario = validate_document(Scenario, raw, file)
        outside = arrival_outside_span(scenario)
        if outside is not None:
            raise ConfigError(file, outside, SPAN_RULE)
        return scenario_workload(scenario, seed)
    if not isinstance(raw, dict):
        raise ConfigError(file, "(top level)", "must be a JSON object")
    recorder = TraceRecorder()
    head: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _LISTS and isinstance(value, list):
            for i, item in enumerate(value):
                _record(recorder, key, i, item, file)
        else:
            head[key] = value
    return _workload(recorder, head, file, replay)


def _streamed(stream: BinaryIO, file: str, replay: ReplayMode) -> Workload:
    """A large file: a trace, streamed."""
    recorder = TraceRecorder()
    head: dict[str, Any] = {}
    events = _events(stream, file)
    if next(events, (None, None, None))[1] != "start_map":
        raise ConfigError(file, "(top level)", "must be a JSON object")
    for prefix, event, key in events:
        if prefix == "" and event == "end_map":
            break
        assert event == "map_key"
        _, first, value = next(events)
        if key in _LISTS and first == "start_array":
            for i, (_, item_event, item_value) in enumerate(events):
                if item_event == "end_array":
                    break
                _record(recorder, key, i, _built(item_event, item_value, events), file)
        else:
            head[key] = _built(first, value, events)
        if head.get("format") == SCENARIO_FORMAT:
            raise ConfigError(file, "(file)", f"is too large for a scenario (at most "
                              f"{MAX_SCENARIO_BYTES} bytes)")
    return _workload(recorder, head, file, replay)


def _events(stream: BinaryIO, file: str) -> Iterator[tuple[str, str, Any]]:
    """The parser's events; its errors become one fixed line (they may quote the input)."""
    try:
        yield from ijson.parse(stream, use_float=True)
    except ijson.JSONError as exc:
        raise ConfigError(file, "(top level)", "is not valid JSON") from exc


def _built(event: str, value: Any, events: Iterator[tuple[str, str, Any]]) -> Any:
    """One whole JSON value from its first event on. An attempt or arrival is a flat object of
    scalars: read in one tight loop; anything nested goes through ijson's general builder."""
    if event == "start_map":
        flat: dict[str, Any] = {}
        for _, event, key in events:
            if event == "end_map":
                return flat
            _, event, value = next(events)
            flat[key] = _built(event, value, events) if event in _OPEN else value
    builder = ijson.ObjectBuilder()
    builder.event(event, value)
    depth = 1 if event in _OPEN else 0
    while depth:
        _, event, value = next(events)
        builder.event(event, value)
        depth += (event in _OPEN) - (event in _CLOSE)
    return builder.value


def _record(recorder: TraceRecorder, key: str, i: int, item: Any, file: str) -> None:
    if i >= MAX_ENTRIES:
        raise ConfigError(file, key, f"has too many entries (at most {MAX_ENTRIES})")
    if key == "attempts":
        recorder.add_attempt(validate_document(TraceAttempt, item, file, Trace, (key, i)))
    else:
        recorder.add_arrival(validate_document(TraceArrival, item, file, Trace, (key, i)))


def _workload(
    recorder: TraceRecorder, head: dict[str, Any], file: str, replay: ReplayMode
) -> Workload:
    """The trace's top-level fields checked (the lists were, item by item), then the workload."""
    trace = validate_document(Trace, head, file)
    return recorder.workload(trace.start_ms, trace.end_ms, replay)
