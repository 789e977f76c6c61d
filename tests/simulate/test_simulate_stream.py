"""R-SIM-4 (issue 29 item 17): a trace is parsed once, streamed, into columns of a few machine
words per attempt; the streamed and the whole-file readings give the same simulation, and bad
input found while streaming is the same one line."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from bench.simulate_memory import write_trace
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.errors import ConfigError
from ledger.simulate import inputs
from ledger.simulate.simulation import simulate
from tests.support.simulation import CATALOG

BIG_CATALOG: dict[str, Any] = {
    "providers": {
        "openai": {"available": True, "api": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1"},
        "anthropic": {"available": True, "api": "anthropic-messages",
                      "baseUrl": "http://127.0.0.1:9"},
    },
    "models": [
        {"provider": p, "id": m, "contextWindow": 200_000,
         "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}]}
        for p, m in (("openai", "gpt-4.1-mini"), ("anthropic", "claude-haiku-4-5"),
                     ("openai", "gpt-4.1"), ("anthropic", "claude-sonnet-4-5"))
    ],
}  # fmt: skip


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file goes through the streamed reader, however small."""
    monkeypatch.setattr(inputs, "MAX_SCENARIO_BYTES", 0)


def _document(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(document))
    return path


def test_r_sim_4_streamed_and_whole_readings_simulate_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trace.json"
    write_trace(path, 140)
    policy = Policy.model_validate({"defaultModel": "openai/gpt-4.1-mini", "callsPerHour": 200})
    catalog = Catalog.model_validate(BIG_CATALOG)
    for replay in ("time", "sequence"):
        whole = simulate(path, policy, catalog, replay=replay).document
        monkeypatch.setattr(inputs, "MAX_SCENARIO_BYTES", 0)
        alike = simulate(path, policy, catalog, replay=replay).document
        monkeypatch.undo()
        assert alike == whole
        assert whole["current"]["calls"] >= 70
        assert whole["current"]["failedByKind"]["rate_limit"] > 0


def test_r_sim_4_a_large_trace_is_never_held_whole(tmp_path: Path) -> None:
    """A 4.6 MB trace (above the whole-file threshold, so streamed for real): the allocations
    peak near the file's size (parsing it whole, twice, and validating it as one document of
    models took over 10 times the file)."""
    path = tmp_path / "trace.json"
    size = write_trace(path, 18_000)
    assert size > inputs.MAX_SCENARIO_BYTES
    tracemalloc.start()
    try:
        workload = inputs.load_workload(path, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(workload.arrivals) == 9_000
    assert peak < 2 * size, (peak, size)


@pytest.mark.usefixtures("streamed")
@pytest.mark.parametrize(
    ("document", "line"),
    [
        ({"attempts": [{"atMs": 0, "source": 1, "model": "alpha/m"},
                       {"atMs": 1, "source": 1, "model": "alpha/m", "inputBytes": 10**13}]},
         "attempts[1].inputBytes: must be at most 1099511627776 (the largest request size the "
         "ledger accepts)"),
        ({"arrivals": [{"atMs": 0, "source": 1, "sk-live-secret": 1}]},
         "arrivals[0].<key>: unknown key (not allowed)"),
        ({"attempts": 5}, "attempts: must be a list"),
        ({"version": 2, "attempts": []}, "version: is not one of the allowed values"),
        ({"format": "ledger-scenario", "start": "2027-01-15T00:00Z"},
         "(file): is too large for a scenario (at most 0 bytes)"),
    ],
)  # fmt: skip
def test_r_sim_4_bad_input_while_streaming_is_one_line(
    tmp_path: Path, document: dict[str, Any], line: str
) -> None:
    path = _document(tmp_path, document)
    with pytest.raises(ConfigError) as error:
        inputs.load_workload(path, 0)
    assert error.value.message == f"{path}: {line}"


@pytest.mark.usefixtures("streamed")
def test_r_sim_4_invalid_json_while_streaming_never_quotes_it(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text('{"attempts": [{"atMs": 0, "source": 1, "model": sk-live-secret}]}')
    with pytest.raises(ConfigError) as error:
        inputs.load_workload(path, 0)
    assert error.value.message == f"{path}: (top level): is not valid JSON"


@pytest.mark.parametrize("streaming", [False, True])
def test_r_sim_4_too_many_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streaming: bool
) -> None:
    if streaming:
        monkeypatch.setattr(inputs, "MAX_SCENARIO_BYTES", 0)
    monkeypatch.setattr(inputs, "MAX_ENTRIES", 3)
    attempts = [{"atMs": i, "source": 1, "model": "alpha/m"} for i in range(4)]
    path = _document(tmp_path, {"attempts": attempts})
    with pytest.raises(ConfigError) as error:
        inputs.load_workload(path, 0)
    assert error.value.message == f"{path}: attempts: has too many entries (at most 3)"


def test_r_sim_4_the_documented_file_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 10)
    path = _document(tmp_path, {"attempts": []})
    with pytest.raises(ConfigError) as error:
        inputs.load_workload(path, 0)
    assert error.value.message == f"{path}: (file): is too large (at most 10 bytes)"
    policy = Policy.model_validate({"defaultModel": "alpha/m"})
    with pytest.raises(ConfigError):
        simulate(path, policy, Catalog.model_validate(CATALOG))
