"""Figure `simulate memory` (issue 29 item 17, R-SIM-4): the peak resident memory of reading the
largest trace the documented limits allow (`MAX_ENTRIES` attempts, under the 512 MiB file cap),
streamed, in a fresh process; and the same for a small trace, to show what is fixed cost.

Invariant: the trace is written to the scratch directory by `write_trace` (the shape `ledger
trace export` writes: every field of an attempt set, one arrival per two attempts) and read by
`ledger.simulate.inputs.load_workload` in a child process, whose `ru_maxrss` is the figure.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from bench.common import Row, Settings
from ledger.simulate.inputs import MAX_INPUT_BYTES
from ledger.simulate.limits import MAX_ENTRIES

QUICK_ATTEMPTS = 20_000
SMALL_ATTEMPTS = 1_000
TARGET_MIB = 1024.0
"""The peak the largest documented input must stay under (a 1 GiB machine can simulate it)."""
_MODELS = ("openai/gpt-4.1-mini", "anthropic/claude-haiku-4-5", "openai/gpt-4.1",
           "anthropic/claude-sonnet-4-5")
_CHILD = (
    "import json, resource, sys, time\n"
    "from pathlib import Path\n"
    "from ledger.simulate.inputs import load_workload\n"
    "t = time.process_time()\n"
    "w = load_workload(Path(sys.argv[1]), 0)\n"
    "print(json.dumps({'arrivals': len(w.arrivals), 'cpu_s': time.process_time() - t,\n"
    "                  'peak_kib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))\n"
)


def write_trace(path: Path, attempts: int, seed: int = 1) -> int:
    """A trace of `attempts` attempts (every seventh a 429 with Retry-After) and one arrival per
    two attempts, written as `ledger trace export` does; returns its size in bytes."""
    rng = random.Random(seed)
    with path.open("w") as out:
        out.write('{"format": "ledger-trace", "version": 1, "start": "2027-01-15T00:00:00.000Z",'
                  f' "startMs": 1800000000000, "endMs": {attempts * 10}, "attempts": [')
        for i in range(attempts):
            attempt: dict[str, object] = {
                "atMs": i * 10, "source": i // 2 + 1, "model": _MODELS[i % 4],
                "role": "primary", "status": "failed" if i % 7 == 0 else "succeeded",
                "durationMs": rng.randint(200, 9000), "inputBytes": rng.randint(100, 90_000),
                "inputTokens": rng.randint(10, 9000), "outputTokens": rng.randint(10, 900),
                "costUsd": round(rng.random() / 100, 6), "costKnown": True,
            }
            if i % 7 == 0:
                attempt.update(kind="rate_limit", subkind="http_429", retryAfterMs=30_000)
            out.write(("," if i else "") + json.dumps(attempt))
        out.write('], "arrivals": [')
        for s in range(attempts // 2):
            out.write(("," if s else "") + json.dumps({"atMs": s * 20, "source": s + 1}))
        out.write("]}\n")
    return path.stat().st_size


def measure(path: Path) -> dict[str, float]:
    """Read `path` in a fresh process: arrivals, CPU seconds, peak RSS (KiB)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                          text=True, check=True, env=env, timeout=3600)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def run(scratch: Path, settings: Settings) -> list[Row]:
    """Peak memory of reading the largest documented trace (quick: a 20,000-attempt one)."""
    scratch.mkdir(parents=True, exist_ok=True)
    attempts = QUICK_ATTEMPTS if settings.quick else MAX_ENTRIES
    rows: list[Row] = []
    for n, label in ((SMALL_ATTEMPTS, "a small trace"), (attempts, "the largest trace")):
        path = scratch / f"trace-{n}.json"
        size = write_trace(path, n)
        wall0 = time.perf_counter()
        got = measure(path)
        wall = time.perf_counter() - wall0
        path.unlink()
        peak = got["peak_kib"] / 1024
        largest = n == MAX_ENTRIES
        rows.append(Row(
            f"simulate: read {label} ({n:,} attempts, {size / 2**20:.0f} MiB), streamed: peak RSS",
            f"{peak:.0f} MiB", "n=1",
            f"<= {TARGET_MIB:.0f} MiB" if largest else "",
            peak <= TARGET_MIB if largest else None,
            f"cpu {got['cpu_s']:.1f} s, wall {wall:.1f} s (fresh process); file cap "
            f"{MAX_INPUT_BYTES / 2**20:.0f} MiB, at most {MAX_ENTRIES:,} attempts",
        ))
    return rows
