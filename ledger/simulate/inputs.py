"""Reading simulation inputs: a trace or a scenario file (told apart by their `format` key).

Invariant: bad input is one ConfigError line naming the file, the field path and the rule, never
a value (`ledger.validation`); nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path

from ledger.errors import ConfigError
from ledger.simulate.scenario import (
    SCENARIO_FORMAT,
    SPAN_RULE,
    Scenario,
    arrival_outside_span,
    scenario_workload,
)
from ledger.simulate.trace import Trace
from ledger.simulate.workload import ReplayMode, Workload, trace_workload
from ledger.validation import parse_document

MAX_INPUT_BYTES = 512 * 1024 * 1024


def read_input(path: Path) -> Trace | Scenario:
    """A trace or a scenario from `path`."""
    try:
        if path.stat().st_size > MAX_INPUT_BYTES:
            raise ConfigError(str(path), "(file)", "is too large")
        text = path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(str(path), "(file)", "does not exist") from exc
    except OSError as exc:
        raise ConfigError(str(path), "(file)", "cannot be read") from exc
    try:
        peek = json.loads(text)
    except (ValueError, RecursionError):
        peek = None  # parse_document gives the one-line error
    if isinstance(peek, dict) and peek.get("format") == SCENARIO_FORMAT:
        scenario = parse_document(Scenario, text, str(path))
        outside = arrival_outside_span(scenario)
        if outside is not None:
            raise ConfigError(str(path), outside, SPAN_RULE)
        return scenario
    return parse_document(Trace, text, str(path))


def load_workload(path: Path, seed: int, replay: ReplayMode = "time") -> Workload:
    """The workload a trace or scenario file describes."""
    document = read_input(path)
    if isinstance(document, Scenario):
        return scenario_workload(document, seed)
    return trace_workload(document, replay)
