"""Profile target: `python -m cProfile -s cumtime -m bench.profile_cycle [N]` (ledger cycles only).

Invariant: uses a fresh scratch ledger in a temporary directory; writes nothing else.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from bench.common import ledger_cycle, make_home, open_ledger, per_cycle


def main(count: int) -> tuple[float, float]:
    """Run `count` ledger cycles after a warm-up; returns (wall, CPU) seconds per cycle."""
    with tempfile.TemporaryDirectory() as tmp:
        ledger = open_ledger(make_home(Path(tmp), "profile"))
        try:
            per_cycle(lambda i: ledger_cycle(ledger, i), 0, 20)
            cpu = time.process_time()
            wall = per_cycle(lambda i: ledger_cycle(ledger, i), 20, count)
            return wall, (time.process_time() - cpu) / count
        finally:
            ledger.close()


if __name__ == "__main__":
    wall, cpu = main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
    print(f"{wall * 1000:.3f} ms wall, {cpu * 1000:.3f} ms CPU per cycle")
