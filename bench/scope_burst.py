"""The scope burst side by side with snipz (issue 32 speed, R-SC-1): overshoot of a $5 daily
limit in a 1,000-reservation burst from 16 processes, and reservations per second.

Invariant: both libraries run the same plan (bench/snipz_driver.py: the processes, each one's
number of attempts, the estimate of the reply allowance, the deterministic real usages) in the
same run, on scratch files in the same directory (one disk), each with the durable settings it
uses by default: every child reserves after a barrier and holds its grants until all children
have reserved, then commits (settles) each grant's real usage. Reservations per second are all
the attempts (granted or refused) over the wall time from the first child's start to the last
child's end of reserving. snipz runs in its own Python 3.13 venv (bench/snipz_venv.py); when it
is unavailable its rows say why and are skipped, never failing the bench.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import snipz_driver as plan
from bench import snipz_venv
from bench.common import Row, Settings, bench_policy, make_home, open_ledger
from ledger.errors import LedgerError, Refused
from ledger.records import Success
from ledger.status import build_status
from ledger.store.engine import chosen_journal_mode

MODEL = "alpha/m0"  # output $2/MTok, 4096-token reply allowance: an 8,192 micro-USD estimate
DRIVER = Path(plan.__file__).resolve()
DRIVER_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Burst:
    """One library's burst: attempts, grants, granted estimates and committed cost (micro-USD),
    reserving wall seconds, committing wall seconds, errors."""

    attempts: int
    granted: int
    granted_micro: int
    committed_micro: int
    reserve_s: float
    commit_s: float
    errors: list[str]

    @classmethod
    def of(cls, reports: list[dict[str, Any]], granted_micro: int, committed_micro: int) -> Burst:
        """Fold the children's reports (monotonic times) with the totals the library holds."""
        return cls(
            sum(int(r["granted"]) + int(r["refused"]) + len(r["errors"]) for r in reports),
            sum(int(r["granted"]) for r in reports),
            granted_micro,
            committed_micro,
            max(r["reserved"] for r in reports) - min(r["start"] for r in reports),
            max(r["committed"] for r in reports) - min(r["commit_start"] for r in reports),
            [e for r in reports for e in r["errors"]],
        )

    def overshoot_usd(self, limit_usd: int) -> float:
        """How far the committed cost and the granted estimates went past the limit, in USD."""
        return max(0, self.granted_micro - limit_usd * 10**6, self.committed_micro - limit_usd
                   * 10**6) / 10**6

    def per_second(self) -> float:
        """Reservation attempts per second of reserving wall time."""
        return self.attempts / self.reserve_s


def ledger_child(
    n: int, barrier: Any, out: Any, home: str, procs: int, attempts: int, limit_usd: int
) -> None:
    """Reserve this child's attempts under the `burst` scope, hold them, then settle each one."""
    report: dict[str, Any] = {"granted": 0, "refused": 0, "errors": [], "estimate_micro": 0}
    refused: Counter[str] = Counter()
    ledger = open_ledger(Path(home), bench_policy(scopes={"burst": {"dailyEstimatedUsd":
                                                                    limit_usd}}))
    try:
        barrier.wait(timeout=plan.BARRIER_TIMEOUT_S)
        report["start"] = time.monotonic()
        held = []
        for i in range(plan.attempts_of(n, procs, attempts)):
            try:
                res = ledger.reserve(f"burst-{n}-{i}", MODEL, scopes=("burst",))
                held.append(res.id)
                report["estimate_micro"] += res.estimate_micro or 0
            except Refused as refusal:
                refused[refusal.reason] += 1
            except LedgerError as error:
                report["errors"].append(f"{type(error).__name__}: {error.message}"[:200])
        report["reserved"] = time.monotonic()
        report["granted"] = len(held)
        report["refused"] = sum(refused.values())
        report["reasons"] = dict(refused)
        barrier.wait(timeout=plan.BARRIER_TIMEOUT_S)
        report["commit_start"] = time.monotonic()
        for i, rid in enumerate(held):
            ledger.settle(rid, Success(input_tokens=0, output_tokens=plan.usage_tokens(n, i)))
        report["committed"] = time.monotonic()
    except Exception as error:  # reported, never swallowed
        report["errors"].append(f"{type(error).__name__}: {error}"[:200])
    finally:
        ledger.close()
    out.put(report)


def ledger_burst(root: Path, procs: int, attempts: int, limit_usd: int) -> tuple[Burst, str]:
    """The burst on a fresh ledger in `root`; the Burst and the refusal reasons seen."""
    policy = bench_policy(scopes={"burst": {"dailyEstimatedUsd": limit_usd}})
    home = make_home(root, "ledger")
    open_ledger(home, policy).close()  # created and migrated before the race
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    children = [
        ctx.Process(target=ledger_child, args=(n, barrier, out, str(home), procs, attempts,
                                               limit_usd))
        for n in range(procs)
    ]
    for child in children:
        child.start()
    reports = [out.get(timeout=DRIVER_TIMEOUT_S) for _ in children]
    for child in children:
        child.join()
    ledger = open_ledger(home, policy)
    try:
        (use,) = [s for s in build_status(ledger)["scopes"] if s["name"] == "burst"]
    finally:
        ledger.close()
    reasons: Counter[str] = Counter()
    for report in reports:
        reasons.update(report.get("reasons", {}))
    burst = Burst.of(
        reports, sum(int(r["estimate_micro"]) for r in reports),
        round(float(use["daily"]["spent_usd"]) * 10**6),
    )
    return burst, ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))


def snipz_burst(root: Path, python: Path, procs: int, attempts: int, limit_usd: int) -> tuple[
    Burst, dict[str, Any]
]:
    """The burst on a fresh snipz SQLite file in `root` (the driver under `python`)."""
    root.mkdir(parents=True, exist_ok=True)
    db = root / "snipz.db"
    done = subprocess.run(
        [str(python), "-I", str(DRIVER), str(db), str(procs), str(attempts), str(limit_usd)],
        env=snipz_venv._clean_env(), capture_output=True, timeout=DRIVER_TIMEOUT_S, cwd=root,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"snipz driver exited {done.returncode}: "
                           f"{snipz_venv._last_line(done.stderr)}")
    found = json.loads(done.stdout)
    return Burst.of(found["reports"], found["granted_micro"], found["committed_micro"]), found


def _usd(micro: int) -> str:
    return f"${micro / 10**6:.6f}"


def _burst_note(burst: Burst, extra: str) -> str:
    errors = f"; {len(burst.errors)} errors, first: {burst.errors[0]}" if burst.errors else ""
    return (
        f"{burst.granted} of {burst.attempts} granted; granted estimates "
        f"{_usd(burst.granted_micro)}, committed {_usd(burst.committed_micro)}; {extra}{errors}"
    )


def run(root: Path, settings: Settings) -> list[Row]:
    """Both bursts in one run; the overshoot and rate rows (snipz's skipped when unavailable)."""
    procs = plan.QUICK_PROCS if settings.quick else plan.PROCS
    attempts = plan.QUICK_ATTEMPTS if settings.quick else plan.ATTEMPTS
    limit = plan.QUICK_LIMIT_USD if settings.quick else plan.LIMIT_USD
    what = f"{attempts:,} reservations from {procs} processes, ${limit} daily limit"
    python, why = snipz_venv.snipz_python(settings.quick)
    mine, reasons = ledger_burst(root, procs, attempts, limit)
    ledger_note = _burst_note(
        mine, f"refused: {reasons or 'none'}; SQLite journal {chosen_journal_mode()}, "
        "synchronous=FULL, write-lock file"
    )
    rows = [
        Row(f"scopes burst: ledger overshoot ({what})", f"${mine.overshoot_usd(limit):.6f}",
            "n=1", "$0", mine.overshoot_usd(limit) == 0 and not mine.errors, ledger_note),
        Row(f"scopes burst: ledger reservations/s ({what})", f"{mine.per_second():,.0f}/s",
            "n=1", note=f"reserving {mine.reserve_s:.2f} s; settling "
            f"{mine.granted / mine.commit_s:,.0f}/s"),
    ]
    if python is None:
        for figure in ("snipz overshoot", "snipz reservations/s", "ledger / snipz reservations/s"):
            rows.append(Row(f"scopes burst: {figure} ({what})", "skipped", "", note=why))
        return rows
    theirs, found = snipz_burst(root / "snipz", python, procs, attempts, limit)
    snipz_note = _burst_note(
        theirs, f"snipz {found['version']} on Python {found['python']}, its SQLite backend as "
        f"documented: journal {found['journal_mode']}, synchronous=NORMAL, BEGIN IMMEDIATE, "
        "busy_timeout 5 s, a new aiosqlite connection per transaction"
    )
    rows += [
        Row(f"scopes burst: snipz overshoot ({what})", f"${theirs.overshoot_usd(limit):.6f}",
            "n=1", note=snipz_note),
        Row(f"scopes burst: snipz reservations/s ({what})", f"{theirs.per_second():,.0f}/s",
            "n=1", note=f"reserving {theirs.reserve_s:.2f} s; committing "
            f"{theirs.granted / theirs.commit_s:,.0f}/s"),
        Row(f"scopes burst: ledger / snipz reservations/s ({what})",
            f"{mine.per_second() / theirs.per_second():.2f}x", "n=1",
            note="same run, same disk, same plan; one burst each, so the spread is unknown"),
    ]
    return rows
