"""Figure `burst`: many `ledger reserve` CLI processes started together (cron on the same minute).

Invariant: every process is a real CLI run with the default busy timeout against one ledger with
`callsPerHour` 20; the figure counts busy exits (target 0) and checks that exactly 20 were granted,
both by exit codes and by the rows in the database (issue 14).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.common import MODEL_KEYS, Row, Settings, make_home, open_ledger
from ledger.store import sqlite_driver

FULL_COUNTS = (48, 96)
QUICK_COUNTS = (8,)
LIMIT = 20


def _burst(home: Path, processes: int) -> tuple[Counter[int], int, float]:
    """Start `processes` reserves at once; exit codes, rows written, wall seconds until all end."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "ledger", "--home", str(home), "reserve"]
    procs = [
        subprocess.Popen([*command, f"burst-{i}", "--model", MODEL_KEYS[0]],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(processes)
    ]
    exits: Counter[int] = Counter()
    for proc in procs:
        exits[proc.wait(timeout=600)] += 1
    wall = time.perf_counter() - start
    with sqlite_driver.connect(home / "ledger.db") as conn:
        written = int(conn.execute("SELECT count(*) FROM reservations").fetchone()[0])
    return exits, written, wall


def run(root: Path, settings: Settings) -> list[Row]:
    """One burst per process count, each on a fresh ledger."""
    rows: list[Row] = []
    for n in QUICK_COUNTS if settings.quick else FULL_COUNTS:
        home = make_home(root, f"burst-{n}")
        (home / "recovery.json").write_text(json.dumps({"callsPerHour": LIMIT}))
        open_ledger(home).close()
        exits, written, wall = _burst(home, n)
        granted = min(n, LIMIT)
        exact = exits[0] == granted == written and exits[3] == n - granted
        rows.append(
            Row(
                f"burst: {n} `ledger reserve` processes at once (callsPerHour {LIMIT})",
                f"{exits[4]} busy exits",
                f"wall {wall:.1f} s",
                f"0 busy; exactly {granted} granted",
                exits[4] == 0 and exact,
                note=f"exit codes {dict(sorted(exits.items()))}; {written} rows",
            )
        )
    return rows
