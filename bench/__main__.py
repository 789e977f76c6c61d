"""`python -m bench [--quick] [--out bench/results.md] [--only NAME ...]`: run every figure.

Invariant: scratch ledgers live in a temporary directory removed afterwards; the table is printed
and written to the output file even when a figure fails (its row then says so).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import (
    burst,
    checkpoint,
    client,
    contention,
    cycle,
    embeddings,
    fleet,
    fleet_serve,
    gateway,
    growth,
    handoff,
    otel,
    report,
    responses,
    routing,
    scopes,
    selection,
    service,
    simulate,
    simulate_memory,
    slow_sync,
    tokens,
    worker_overhead,
)
from bench.common import Row, Settings

FIGURES: dict[str, Callable[[Path, Settings], list[Row]]] = {
    "cycle": cycle.run,
    "contention": contention.run,
    "burst": burst.run,
    "handoff": handoff.run,
    "selection": selection.run,
    "growth": growth.run,
    "worker": worker_overhead.run,
    "fleet": fleet.run,
    "service": service.run,
    "gateway": gateway.run,
    "responses": responses.run,
    "embeddings": embeddings.run,
    "simulate": simulate.run,
    "simulate-memory": simulate_memory.run,
    "routing": routing.run,
    "scopes": scopes.run,
    "otel": otel.run,  # issue 48: tracing with a hanging collector / tracing off
    "checkpoint": checkpoint.run,
    "checkpoint-truncate": checkpoint.run_truncating,
    "fleet-serve": fleet_serve.run,
    "client": client.run,
    "service-slow-sync": slow_sync.run,  # issue 46: group commit where a sync costs 2 ms
    "tokens": tokens.run,
}


RESULTS = Path("bench/results.md")
QUICK_RESULTS = Path("bench/results-quick.md")  # untracked (.gitignore): smoke numbers only


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; `out` defaults to the tracked bench/results.md for a full run and to the
    untracked bench/results-quick.md for `--quick` (issue 33: a smoke run never overwrites the
    published numbers unless --out says so)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument(
        "--out", type=Path, default=None,
        help=f"results file (default {RESULTS}; with --quick {QUICK_RESULTS})",
    )  # fmt: skip
    parser.add_argument("--only", nargs="*", choices=sorted(FIGURES), default=None)
    parser.add_argument("--scratch", type=Path, default=None, help="parent dir for scratch DBs")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = QUICK_RESULTS if args.quick else RESULTS
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the figures; print the table; write the results file."""
    args = parse_args(argv)
    settings = Settings.make(args.quick)
    rows: list[Row] = []
    notes: list[str] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="ledger-bench-", dir=args.scratch) as tmp:
        for name in args.only or list(FIGURES):
            print(f"running {name} ...", file=sys.stderr, flush=True)
            try:
                rows.extend(FIGURES[name](Path(tmp) / name, settings))
            except Exception as error:  # a figure's failure is reported, not hidden
                failed = True
                traceback.print_exc()
                rows.append(Row(name, "failed", "", note=type(error).__name__))
    text = report.document(rows, args.quick, notes)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
