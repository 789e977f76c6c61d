"""Figure `simulate` (issue 23): a day of queue items with a 40-minute outage of the primary
provider, simulated through the real code in virtual time; items per second of wall time, and
the process's resident memory at each quarter of the simulated day (it must stay flat).

Invariant: one policy run per measurement (a side-by-side report runs two); the scenario is the
shipped example day with the arrival rate set to the item count.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

from bench.common import Row, Settings
from ledger.catalog import parse_catalog
from ledger.config import parse_policy
from ledger.simulate.runner import run_policy
from ledger.simulate.scenario import Scenario, scenario_workload

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "simulate"
FULL_ITEMS = 10_000
QUICK_ITEMS = 200
TARGET_S = 60.0
DAY_POLICY = {"defaultModel": "openai/gpt-4.1-mini", "callsPerHour": 1200, "dailyEstimatedUsd": 50}
"""Room for the day's 10,000 calls; backups chosen by the selector (cheapest other provider)."""
DAY_MS = 24 * 3_600_000


def day_scenario(items: int) -> Scenario:
    """The example day: `items` arrivals spread evenly over 24 h, the primary (openai) failing
    every call from 02:00 for 40 minutes."""
    document: dict[str, Any] = json.loads((EXAMPLES / "outage-day.json").read_text())
    document["windows"] = [
        {"target": "openai", "from": "02:00", "for": "40m", "status": 503,
         "errorCode": "server_error"}
    ]
    document["arrivals"] = [{"from": "00:00", "until": "24:00", "perHour": items / 24}]
    return Scenario.model_validate(document)


def _rss_mib() -> float:
    """Resident memory now (Linux /proc), else the peak (ru_maxrss), in MiB."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize() / 2**20
    except (OSError, IndexError, ValueError):
        return _peak_rss_mib()


def _peak_rss_mib() -> float:
    """The process's peak resident memory so far (ru_maxrss is in KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(scratch: Path, settings: Settings) -> list[Row]:
    """Simulate the day once; report wall time, items per wall second and memory."""
    del scratch  # the simulator makes (and removes) its own throw-away ledger
    items = QUICK_ITEMS if settings.quick else FULL_ITEMS
    scenario = day_scenario(items)
    workload = scenario_workload(scenario, seed=1)
    policy = parse_policy(json.dumps(DAY_POLICY))
    catalog = parse_catalog((EXAMPLES / "catalog.json").read_text())
    quarters = [workload.start_ms + DAY_MS * q // 4 for q in (1, 2, 3, 4)]
    samples: list[float] = []

    arrivals = len(workload.arrivals)

    def sample(now_ms: int, reported: int) -> None:
        # the day's last item counts as its end: the queue drains just before 24:00, and a
        # sample after the run would include the whole history read back for the report
        while quarters and (now_ms >= quarters[0] or reported >= arrivals):
            quarters.pop(0)
            samples.append(_rss_mib())

    wall0, cpu0 = time.perf_counter(), time.process_time()
    record = run_policy(workload, policy, catalog, 1, workload.end_ms + 3_600_000, sample)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    while len(samples) < 4:  # a run that stopped early: sampled now
        samples.append(_rss_mib())
    peak = _peak_rss_mib()
    done = record.totals.states.get("done", 0)
    calls = len(record.history.attempts)
    items = len(workload.arrivals)
    label = f"simulate: a day of {items:,} items, 40-min outage of the primary"
    rss = ", ".join(f"{m:.0f}" for m in samples)
    return [
        Row(f"{label}: wall time", f"{wall:.1f} s", "n=1", f"<= {TARGET_S:.0f} s",
            wall <= TARGET_S if not settings.quick else None,
            f"cpu {cpu:.1f} s; {done:,} done, {calls:,} calls; on the simulator's throw-away "
            "ledger (synchronous=OFF, journal in memory, no write-lock file)"),
        Row(f"{label}: items per second of wall time", f"{items / wall:.0f}/s", "n=1",
            note=f"{items / cpu:.0f}/s of CPU time"),
        Row(f"{label}: resident memory at 1/4, 1/2, 3/4, end of the day (last item)",
            f"{rss} MiB", "n=1",
            note=f"growth {samples[-1] - samples[0]:+.0f} MiB from the first quarter; "
            f"peak {peak:.0f} MiB (the run's history read back for the report included)"),
    ]
