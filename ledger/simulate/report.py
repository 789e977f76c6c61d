"""The simulation report (R-SIM-1): the figures of each run, side by side, as JSON and text.

Invariant: pure — the figures come from each run's own ledger history and loop counters; the
document holds integers, strings and USD amounts rounded to micro-USD, so the same runs give the
same bytes (R-SIM-3). Nothing here reads a clock or a path.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ledger.clock import human_duration_ms, iso
from ledger.simulate.runner import Comparison, RunRecord

REPORT_FORMAT = "ledger-simulation"
REPORT_VERSION = 1
FAILED = "failed"


def run_figures(run: RunRecord, start_ms: int) -> dict[str, Any]:
    """The figures of one run."""
    attempts = run.history.attempts
    failed = [a for a in attempts if a.status == FAILED]
    states = run.totals.states
    fallbacks = Counter(
        f"{a.fallback_from} -> {a.model}" for a in attempts if a.role == "fallback"
    )
    longest = max(
        run.bands.values(), key=lambda b: (b.until_ms - b.created_ms, b.target), default=None
    )
    cost = sum(a.cost_micro or 0 for a in attempts)
    drained = None if run.drained_at_ms is None else run.drained_at_ms - start_ms
    return {
        "sources": sum(states.values()),
        "done": states.get("done", 0),
        "paused": states.get("paused", 0),
        "unfinished": states.get("queued", 0) + states.get("leased", 0),
        "items": dict(sorted(run.outcomes.items())),
        "calls": len(attempts),
        "callsFailed": len(failed),
        "failedByKind": dict(sorted(Counter(str(a.kind) for a in failed).items())),
        "callsByModel": dict(sorted(Counter(a.model for a in attempts).items())),
        "estimatedCostUsd": round(cost / 1_000_000, 6),
        "fallbacks": dict(sorted(fallbacks.items())),
        "refusals": dict(sorted(run.refusals.items())),
        "timeToDrainMs": drained,
        "timeToDrain": None if drained is None else human_duration_ms(drained),
        "longestCooldown": None
        if longest is None
        else {
            "scope": longest.scope,
            "target": longest.target,
            "kind": longest.kind,
            "origin": longest.origin,
            "ms": longest.until_ms - longest.created_ms,
            "duration": human_duration_ms(longest.until_ms - longest.created_ms),
        },
        "unobservedCalls": run.unobserved_calls,
    }


def report_json(result: Comparison, policy_fingerprints: tuple[str, str | None]) -> dict[str, Any]:
    """The whole report document (`ledger simulate --json`)."""
    workload = result.workload
    start = workload.start_ms
    current = run_figures(result.current, start)
    current["policy"] = policy_fingerprints[0]
    candidate = None
    if result.candidate is not None:
        candidate = run_figures(result.candidate, start)
        candidate["policy"] = policy_fingerprints[1]
    return {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "input": workload.kind,
        "seed": result.seed,
        "start": iso(start),
        "end": iso(result.end_ms),
        "arrivals": len(workload.arrivals),
        "current": current,
        "candidate": candidate,
    }


_ROWS: tuple[tuple[str, str], ...] = (
    ("sources", "sources"),
    ("done", "done"),
    ("paused", "paused"),
    ("unfinished", "unfinished (still queued)"),
    ("calls", "calls made"),
    ("callsFailed", "calls on failing targets"),
    ("estimatedCostUsd", "estimated cost (USD)"),
    ("timeToDrain", "time to drain"),
    ("unobservedCalls", "calls to targets the input never observed"),
)
_MAPS: tuple[tuple[str, str], ...] = (
    ("items", "items"),
    ("failedByKind", "failed calls"),
    ("callsByModel", "calls"),
    ("fallbacks", "fallback"),
    ("refusals", "refused"),
)


def render_text(document: dict[str, Any]) -> str:
    """The report as a text table: current and candidate side by side."""
    runs = [("current", document["current"])]
    if document["candidate"] is not None:
        runs.append(("candidate", document["candidate"]))
    rows: list[tuple[str, list[str]]] = [("policy", [str(r["policy"]) for _, r in runs])]
    for key, label in _ROWS:
        rows.append((label, [_cell(r[key]) for _, r in runs]))
    for key, label in _MAPS:
        names = sorted({name for _, r in runs for name in r[key]})
        rows.extend((f"{label}: {name}", [str(r[key].get(name, 0)) for _, r in runs])
                    for name in names)
    rows.append(("longest cooldown", [_cooldown(r["longestCooldown"]) for _, r in runs]))
    width = max(len(label) for label, _ in rows)
    cols = [max(len(name), *(len(cells[i]) for _, cells in rows)) for i, (name, _) in
            enumerate(runs)]
    head = (f"simulated {document['input']} from {document['start']} to {document['end']}, "
            f"{document['arrivals']} arrivals, seed {document['seed']}")
    lines = [head, "", "  ".join([" " * width, *(n.rjust(c) for (n, _), c in zip(runs, cols,
                                                                             strict=True))])]
    for label, cells in rows:
        lines.append("  ".join([label.ljust(width),
                                *(v.rjust(c) for v, c in zip(cells, cols, strict=True))]))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "not drained"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _cooldown(band: dict[str, Any] | None) -> str:
    if band is None:
        return "none"
    return f"{band['target']} {band['duration']} ({band['kind']})"
