"""`ledger simulate` as one library call: read the input, run both policies, build the report.

Invariant: the result depends only on the input file, the policies, the catalog, the seed and the
options (R-SIM-3); the only thing written is the temporary ledger each run removes again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.simulate.inputs import load_workload
from ledger.simulate.report import report_json
from ledger.simulate.runner import Comparison, compare
from ledger.simulate.workload import ReplayMode

DEFAULT_DRAIN_FOR_MS = 24 * 3600 * 1000
"""How long after the input's end the queue may keep draining (virtual time)."""


@dataclass(frozen=True)
class Simulation:
    """The runs and the report document."""

    comparison: Comparison
    document: dict[str, Any]


def simulate(
    input_path: Path,
    current: Policy,
    catalog: Catalog,
    *,
    candidate: Policy | None = None,
    seed: int = 0,
    replay: ReplayMode = "time",
    drain_for_ms: int = DEFAULT_DRAIN_FOR_MS,
) -> Simulation:
    """Replay a trace or scenario under the current policy and, when given, the candidate."""
    workload = load_workload(input_path, seed, replay)
    result = compare(
        workload, current, catalog, seed, candidate=candidate, drain_for_ms=drain_for_ms
    )
    fingerprints = (current.fingerprint(), None if candidate is None else candidate.fingerprint())
    return Simulation(result, report_json(result, fingerprints))
