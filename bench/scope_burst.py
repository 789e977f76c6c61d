"""The scope burst side by side with snipz (issue 32 speed, R-SC-1): overshoot of a $5 daily
limit in a 1,000-reservation burst from 16 processes, and reservations per second.

Invariant: both libraries run the same plan (bench/snipz_driver.py: the processes, each one's
number of attempts, the estimate of the reply allowance, the deterministic real usages) in the
same run, on scratch files in the same directory (one disk), each with the durable settings it
uses by default: every child reserves after a barrier and holds its grants until all children
have reserved, then commits (settles) each grant's real usage. Reservations per second are all
the attempts (granted or refused) over the wall time from the first child's start to the last
child's end of reserving. A full run adds snipz at synchronous=FULL (ledger's durability) as a
second comparison, since snipz's own default does not sync a commit. snipz runs in its own
Python 3.13 venv (bench/snipz_venv.py); when it is unavailable its rows say why and are skipped,
never failing the bench.
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
from bench.common import (
    Row,
    Settings,
    Stats,
    bench_policy,
    make_home,
    open_ledger,
    ratio_row,
)
from ledger.errors import LedgerError, Refused
from ledger.records import Success
from ledger.status.document import build_status
from ledger.store.engine import chosen_journal_mode

MODEL = "alpha/m0"  # output $2/MTok, 4096-token reply allowance: an 8,192 micro-USD estimate
DRIVER = Path(plan.__file__).resolve()
DRIVER_TIMEOUT_S = 1800.0
ROUNDS = 3  # full mode: ledger, snipz, snipz at synchronous=FULL, three times over


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


def snipz_burst(
    root: Path, python: Path, procs: int, attempts: int, limit_usd: int, sync: str = "default"
) -> tuple[Burst, dict[str, Any]]:
    """The burst on a fresh snipz SQLite file in `root` (the driver under `python`); `sync`
    "FULL" runs it at ledger's synchronous=FULL instead of snipz's own NORMAL."""
    root.mkdir(parents=True, exist_ok=True)
    db = root / "snipz.db"
    done = subprocess.run(
        [str(python), "-I", str(DRIVER), str(db), str(procs), str(attempts), str(limit_usd),
         sync],
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


def _rate_row(figure: str, bursts: list[Burst]) -> Row:
    rates = Stats.of([b.per_second() for b in bursts])
    return Row(
        figure, f"{rates.median:,.0f}/s", f"{rates.low:,.0f}-{rates.high:,.0f} (n={rates.runs})",
        note="reserving " + ", ".join(f"{b.reserve_s:.2f}" for b in bursts) + " s; committing "
        + ", ".join(f"{b.granted / b.commit_s:,.0f}" for b in bursts) + "/s",
    )


def _overshoot_row(figure: str, bursts: list[Burst], limit: int, note: str, target: str) -> Row:
    worst = max(b.overshoot_usd(limit) for b in bursts)
    errors = sum(len(b.errors) for b in bursts)
    met = (worst == 0 and errors == 0) if target else None
    return Row(figure, f"${worst:.6f}", f"worst of n={len(bursts)}", target, met, note)


def run(root: Path, settings: Settings) -> list[Row]:
    """Both bursts, interleaved round by round in one run; the overshoot and rate rows (snipz's
    skipped with the reason when unavailable)."""
    procs = plan.QUICK_PROCS if settings.quick else plan.PROCS
    attempts = plan.QUICK_ATTEMPTS if settings.quick else plan.ATTEMPTS
    limit = plan.QUICK_LIMIT_USD if settings.quick else plan.LIMIT_USD
    rounds = 1 if settings.quick else ROUNDS
    what = f"{attempts:,} reservations from {procs} processes, ${limit} daily limit"
    python, why = snipz_venv.snipz_python(settings.quick)
    syncs = ["default"] if settings.quick else ["default", "FULL"]
    mine: list[Burst] = []
    theirs: dict[str, list[Burst]] = {sync: [] for sync in syncs}
    reasons = ""
    found: dict[str, Any] = {}
    for k in range(rounds):  # interleaved, so a change in machine load hits both alike
        burst, reasons = ledger_burst(root / f"round-{k}", procs, attempts, limit)
        mine.append(burst)
        if python is not None:
            for sync in syncs:
                burst, found = snipz_burst(root / f"round-{k}" / f"snipz-{sync}", python, procs,
                                           attempts, limit, sync)
                theirs[sync].append(burst)
    last = mine[-1]
    rows = [
        _overshoot_row(
            f"scopes burst: ledger overshoot ({what})", mine, limit,
            _burst_note(last, f"refused: {reasons or 'none'}; SQLite journal "
                        f"{chosen_journal_mode()}, synchronous=FULL, write-lock file"),
            "$0",
        ),
        _rate_row(f"scopes burst: ledger reservations/s ({what})", mine),
    ]
    if python is None:
        for figure in ("snipz overshoot", "snipz reservations/s", "ledger / snipz reservations/s"):
            rows.append(Row(f"scopes burst: {figure} ({what})", "skipped", "", note=why))
        return rows
    default = theirs["default"]
    rows += [
        _overshoot_row(
            f"scopes burst: snipz overshoot ({what})", default, limit,
            _burst_note(default[-1], f"snipz {found['version']} on Python {found['python']}, "
                        f"its SQLite backend as documented: journal {found['journal_mode']}, "
                        "synchronous=NORMAL, BEGIN IMMEDIATE, busy_timeout 5 s, a new aiosqlite "
                        "connection per transaction"),
            "",
        ),
        _rate_row(f"scopes burst: snipz reservations/s ({what})", default),
        _ratio(f"scopes burst: ledger / snipz reservations/s ({what})", mine, default,
               "same run, same disk, same plan, rounds interleaved; snipz at its default "
               "synchronous=NORMAL (WAL: a commit is not synced to disk)"),
    ]
    if "FULL" in theirs:
        full = theirs["FULL"]
        rows += [
            _overshoot_row(f"scopes burst: snipz overshoot at synchronous=FULL ({what})", full,
                           limit, _burst_note(full[-1], "snipz's WAL with its synchronous "
                                              "pragma replaced by FULL (ledger's)"), ""),
            _rate_row(f"scopes burst: snipz reservations/s at synchronous=FULL ({what})", full),
            _ratio(f"scopes burst: ledger / snipz at synchronous=FULL, reservations/s ({what})",
                   mine, full, "both sync every commit; snipz still in WAL, ledger in "
                   f"{chosen_journal_mode()} journal mode (its choice on this SQLite)"),
        ]
    return rows


def _ratio(figure: str, mine: list[Burst], theirs: list[Burst], note: str) -> Row:
    ratio = Stats.of([a.per_second() / b.per_second() for a, b in zip(mine, theirs, strict=True)])
    return ratio_row(figure, ratio, "", None, note=note)
