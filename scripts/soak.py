#!/usr/bin/env python3
"""Soak test (issue 8 item 6): N `ledger worker run --loop` processes against a randomly failing
local stand-in for a bounded time, SIGKILLing and restarting a random worker now and then; then
every invariant is checked straight from the database file (independently of the ledger code).

Invariants checked (any violation → exit 1):
- hourly: for every reservation, the reservations created in its trailing hour (itself included,
  in commit order) never exceed `callsPerHour` (R-RES-1); every hour of the last day's
  `cost_hours.attempts` is the count of its reservations (the rolling hour reads them);
- per source: a non-override reservation never found `sourceCalls` reservations already held, nor
  made the distinct models exceed `sourceModels` (R-RES-6, R-RES-7);
- daily: the summed cost (actual where known, else estimate) of the last 24 h ≤ the ceiling
  (R-RES-2);
- `PRAGMA integrity_check` is ok (kill -9 at any moment);
- no source was held by two workers: one source's attempts never overlap in time (R-Q-2);
- every worker stops within a bound on SIGTERM, with its lease released (R-Q-4).

Usage: python scripts/soak.py [--seconds 600] [--workers 4] [--seed N] [--home DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ledger.standin.server import Scripted, StandIn  # noqa: E402
from ledger.store import sqlite_driver  # noqa: E402

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
STOP_BOUND_S = 15.0

POLICY: dict[str, Any] = {
    "defaultModel": "north/a1",
    "callsPerHour": 400,  # resized per run by budget_for(); see there
    "dailyEstimatedUsd": 0.18,
    "sourceCalls": 4,
    "sourceModels": 2,
    "timeoutMs": 2_000,
    "sourceTimeMs": 20_000,
    "replyTokens": 512,
    "leaseMs": 5_000,
}

MODELS = (  # provider, id, api, $/MTok in, out
    ("north", "a1", "openai-chat", 0.5, 1.5),
    ("north", "a2", "openai-chat", 1.0, 3.0),
    ("south", "b1", "anthropic-messages", 0.6, 2.0),
    ("south", "b2", "anthropic-messages", 1.2, 4.0),
    ("east", "c1", "openai-chat", 0.8, 2.5),
    ("east", "c2", "openai-chat", 1.5, 5.0),
)

_OK = Scripted(text='{"ok": true}', input_tokens=80, output_tokens=12)
REPLIES: tuple[tuple[float, Scripted], ...] = (
    (70.0, _OK),
    (4.0, Scripted(text='{"ok": true}', delay_s=0.4)),
    (1.0, Scripted(delay_s=3.0)),  # past the 2 s deadline: a timeout
    (6.0, Scripted(status=503)),
    (4.0, Scripted(status=429, retry_after="1")),
    (0.2, Scripted(status=401)),
    (0.5, Scripted(status=400, error_code="context_length_exceeded")),
    (4.0, Scripted(text='{"ok": tr', stop_reason="length")),
    (4.0, Scripted(text="not json at all")),
    (1.0, Scripted(status=200, raw_body=b"{broken")),
    (1.0, Scripted(text='{"ok": true}', cut_body=True)),
    (0.5, Scripted(text='{"ok": true}', stop_reason="content_filter")),
)


class RandomStandIn(StandIn):
    """The stand-in, replying from a seeded weighted random script."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()

    def next_reply(self, model_id: str | None) -> Scripted:
        """A random reply (thread-safe)."""
        with self._rng_lock:
            weights = [w for w, _ in REPLIES]
            return self._rng.choices([r for _, r in REPLIES], weights)[0]


def budget_for(seconds: float) -> dict[str, Any]:
    """Shared budgets sized so that, at this machine's few attempts per second, the hourly and
    daily ceilings are reached during the run and refusals race with grants."""
    calls = max(40, int(seconds * 3))
    return {**POLICY, "callsPerHour": calls, "dailyEstimatedUsd": round(calls * 0.00045, 6)}


SOAK_KEY_ENV = "LEDGER_SOAK_STANDIN_KEY"
SOAK_ENV = {SOAK_KEY_ENV: "soak-standin-key"}


def write_home(home: Path, standin: StandIn, policy: Mapping[str, Any]) -> None:
    """catalog.json and recovery.json for the soak."""
    base = {"openai-chat": standin.base_url_openai,
            "anthropic-messages": standin.base_url_anthropic}
    # The strict stand-in's Anthropic path requires a key (issue 13 item 4).
    providers = {p: {"available": True, "api": api, "baseUrl": base[api],
                     "credentialEnv": SOAK_KEY_ENV}
                 for p, _, api, _, _ in MODELS}
    models = [
        {"provider": p, "id": m, "contextWindow": 100_000, "maxOutputTokens": 4096,
         "pricing": [{"inputUsdPerMTok": pi, "outputUsdPerMTok": po}]}
        for p, m, _, pi, po in MODELS
    ]
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "catalog.json").write_text(json.dumps({"providers": providers, "models": models}))
    (home / "recovery.json").write_text(json.dumps(policy))


def ledger_cmd(home: Path, *args: str) -> list[str]:
    """argv for a `ledger` subprocess on this checkout."""
    return [sys.executable, "-m", "ledger", "--home", str(home), *args]


def child_env() -> dict[str, str]:
    """Environment for children: this checkout first, no inherited ledger locations."""
    env = {k: v for k, v in os.environ.items() if k not in {"LEDGER_DB", "LEDGER_HOME"}}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(SOAK_ENV)
    return env


@dataclass
class Fleet:
    """The worker processes, restartable by slot."""

    home: Path
    log_dir: Path
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    generation: dict[int, int] = field(default_factory=dict)
    kills: int = 0
    early_terms: int = 0

    def start(self, slot: int) -> None:
        """Start (or restart) the worker in a slot with a fresh worker id."""
        gen = self.generation.get(slot, -1) + 1
        self.generation[slot] = gen
        worker_id = f"soak-w{slot}-g{gen}"
        with (self.log_dir / f"{worker_id}.log").open("wb") as log:
            self.procs[slot] = subprocess.Popen(
                ledger_cmd(self.home, "worker", "run", "--loop", "--max-sleep", "0.5",
                           "--worker-id", worker_id, "--json"),
                cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
            )

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL a random worker and start a new one in its slot."""
        slot = rng.choice(sorted(self.procs))
        proc = self.procs[slot]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.kills += 1
        self.start(slot)

    def stop_all(self) -> list[str]:
        """SIGTERM every worker; problems (late or failed exits) are returned as violations."""
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        problems = []
        deadline = time.monotonic() + STOP_BOUND_S
        for slot, proc in sorted(self.procs.items()):
            try:
                code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                problems.append(f"worker slot {slot} did not stop within {STOP_BOUND_S:.0f}s")
                continue
            if code == -signal.SIGTERM:
                self.early_terms += 1  # still starting: no handler installed, no lease held yet
            elif code not in (0, 3):
                problems.append(f"worker slot {slot} exited with code {code}")
        return problems


def add_sources(home: Path, start: int, count: int) -> None:
    """Enqueue sources through the library (one write transaction each)."""
    from ledger.api import Ledger

    led = Ledger.open(home, str(home / "ledger.db"), env=SOAK_ENV)
    try:
        for n in range(start, start + count):
            led.add_source(f"soak-{n:05d}", f"soak payload {n}: answer with a JSON object")
    finally:
        led.close()


def clear_cooldowns(home: Path) -> int:
    """The operator clears every cooldown (as `ledger cooldown clear --force` would), so the soak
    keeps traffic flowing; returns how many were removed."""
    from ledger.api import Ledger
    from ledger.kinds import CooldownScope
    from ledger.store.views import cooldown_list

    led = Ledger.open(home, str(home / "ledger.db"), env=SOAK_ENV)
    try:
        _, rows = cooldown_list(led.db)
        targets = {(CooldownScope(r.scope), r.target) for r in rows}
        cleared = [led.store.clear_cooldown(scope, target, True) for scope, target in targets]
        return sum(change.removed for change in cleared)
    finally:
        led.close()


# --------------------------------------------------------------------------- invariants


def check_invariants(db: Path, policy: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Every invariant, from the database file alone; returns (violations, figures)."""
    conn = sqlite_driver.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return _check(conn, policy)
    finally:
        conn.close()


def _hour_attempts_differ(conn: sqlite3.Connection) -> bool:
    """Whether an hour of the last day holds `attempts` other than COUNT(*) of its reservations
    (the rolling hour's count reads its whole hours from them, R-RES-1); older hours may have
    been folded by compaction, which leaves their totals."""
    newest = conn.execute("SELECT newest_ms FROM clock WHERE id = 1").fetchone()
    if newest is None:
        return False
    since = int(newest[0]) - DAY_MS
    hour = f"created_ms - created_ms % {HOUR_MS}"
    stored = conn.execute(
        "SELECT hour_start_ms, attempts FROM cost_hours WHERE hour_start_ms > ? AND attempts > 0",
        (since,),
    ).fetchall()
    counted = conn.execute(
        f"SELECT {hour}, count(*) FROM reservations WHERE {hour} > ? GROUP BY {hour}", (since,)
    ).fetchall()
    return dict(stored) != dict(counted)


def _check(conn: sqlite3.Connection, policy: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    violations: list[str] = []
    integrity = conn.execute("PRAGMA integrity_check").fetchall()
    if integrity != [("ok",)]:
        violations.append("integrity_check failed")
    rows = conn.execute(
        "SELECT id, source_id, model_key, role, created_ms, deadline_ms, settled_ms, status, "
        "cost_micro FROM reservations ORDER BY id"
    ).fetchall()
    limit = int(policy["callsPerHour"])
    window: list[int] = []  # created_ms of reservations in commit order
    worst_hour = 0
    for _id, _src, _model, _role, created, *_ in rows:
        window.append(created)
        in_hour = sum(1 for t in window if t > created - HOUR_MS)
        worst_hour = max(worst_hour, in_hour)
    if worst_hour > limit:
        violations.append(f"hourly budget exceeded: {worst_hour} > {limit}")
    if _hour_attempts_differ(conn):
        violations.append("hour totals: cost_hours attempts differ from the reservations' count")
    per_source: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        per_source.setdefault(row[1], []).append(row)
    calls_cap, models_cap = int(policy["sourceCalls"]), int(policy["sourceModels"])
    overlaps = 0
    for source, items in per_source.items():
        models: set[str] = set()
        busy_until = None
        for held, (_id, _s, model, role, created, deadline, settled, _st, _c) in enumerate(items):
            if role != "override":
                if held >= calls_cap:
                    violations.append(f"source calls cap broken on {source}")
                if model not in models and len(models) + 1 > models_cap:
                    violations.append(f"source models cap broken on {source}")
            models.add(model)
            if busy_until is not None and created < busy_until:
                overlaps += 1
            busy_until = settled if settled is not None else deadline
    if overlaps:
        violations.append(f"{overlaps} attempts overlapped an attempt of the same source")
    ceiling = policy.get("dailyEstimatedUsd")
    spent = sum(int(r[8] or 0) for r in rows)
    if ceiling is not None and spent > int(float(ceiling) * 1_000_000):
        violations.append("daily cost ceiling exceeded")
    statuses = dict(conn.execute("SELECT status, count(*) FROM reservations GROUP BY status"))
    roles = dict(conn.execute("SELECT role, count(*) FROM reservations GROUP BY role"))
    kinds = dict(conn.execute(
        "SELECT kind, count(*) FROM reservations WHERE kind IS NOT NULL GROUP BY kind"))
    states = dict(conn.execute("SELECT state, count(*) FROM sources GROUP BY state"))
    figures = {
        "attempts": len(rows),
        "statuses": statuses,
        "failovers": roles.get("fallback", 0),
        "corrections": roles.get("correction", 0),
        "failure_kinds": kinds,
        "cooldowns_set": conn.execute("SELECT count(*) FROM cooldowns").fetchone()[0],
        "sources": states,
        "worst_hour": worst_hour,
        "hourly_limit": limit,
        "spent_usd": spent / 1_000_000,
        "ceiling_usd": ceiling,
    }
    return violations, figures


# --------------------------------------------------------------------------- main


def soak(seconds: float, workers: int, seed: int, home: Path) -> tuple[list[str], dict[str, Any]]:
    """Run the soak in `home`; returns (violations, figures)."""
    rng = random.Random(seed)
    started = time.monotonic()
    policy = budget_for(seconds)
    with RandomStandIn(seed) as standin:
        write_home(home, standin, policy)
        add_sources(home, 0, 60)
        fleet = Fleet(home, home)
        for slot in range(workers):
            fleet.start(slot)
        added, next_kill = 60, time.monotonic() + rng.uniform(2, 6)
        next_feed = next_clear = time.monotonic() + 1
        cleared = 0
        while time.monotonic() - started < seconds:
            time.sleep(0.1)
            now = time.monotonic()
            if now >= next_kill:
                fleet.kill_one(rng)
                next_kill = now + rng.uniform(2, 6)
            if now >= next_feed:
                add_sources(home, added, 5)
                added, next_feed = added + 5, now + 1
            if now >= next_clear:
                cleared += clear_cooldowns(home)
                next_clear = now + 10
        problems = fleet.stop_all()
        requests = len(standin.requests)
    violations, figures = check_invariants(home / "ledger.db", policy)
    figures.update({
        "seconds": round(time.monotonic() - started, 1), "workers": workers, "seed": seed,
        "kills_survived": fleet.kills, "terminated_while_starting": fleet.early_terms,
        "http_requests": requests, "sources_added": added, "cooldowns_cleared": cleared,
    })
    return problems + violations, figures


def report(violations: Sequence[str], figures: Mapping[str, Any]) -> str:
    """The one-screen text report."""
    f = figures
    lines = [
        f"soak: {f['seconds']} s, {f['workers']} workers, seed {f['seed']}, "
        f"{f['kills_survived']} SIGKILLs survived "
        f"({f['terminated_while_starting']} SIGTERMed while starting)",
        f"  sources     added {f['sources_added']}, by state {f['sources']}",
        f"  attempts    {f['attempts']} ({f['http_requests']} HTTP requests), {f['statuses']}",
        f"  failovers   {f['failovers']} fallbacks, {f['corrections']} corrections",
        f"  failures    {f['failure_kinds']}",
        f"  cooldowns   {f['cooldowns_cleared']} cleared by the operator every 10 s, "
        f"{f['cooldowns_set']} active at the end",
        f"  hourly      worst trailing hour {f['worst_hour']} / {f['hourly_limit']}",
        f"  daily       ${f['spent_usd']:.4f} / ${f['ceiling_usd']}",
        f"  violations  {len(violations)}",
    ]
    lines += [f"    - {v}" for v in violations]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, soak, report; exit 1 on any violation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--home", type=Path, default=None, help="keep the state here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    if args.workers < 1 or args.seconds <= 0:
        parser.error("--workers and --seconds must be positive")
    if args.home is not None:
        violations, figures = soak(args.seconds, args.workers, seed, args.home)
    else:
        with tempfile.TemporaryDirectory(prefix="ledger-soak-") as tmp:
            violations, figures = soak(args.seconds, args.workers, seed, Path(tmp))
    if args.json:
        print(json.dumps({"violations": list(violations), **figures}, indent=2))
    else:
        print(report(violations, figures))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
