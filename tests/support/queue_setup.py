"""A state directory on the local stand-in, `ledger worker run` processes and direct reads of the
ledger file: shared by the queue, worker, service-worker and soak tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from ledger.api import Ledger
from ledger.standin.server import StandIn
from ledger.store import queue as q
from ledger.store import sqlite_driver
from ledger.worker.queue import HandlerResult, ItemReport
from ledger.worker.runner import Job, echo_handler, run_item

ROOT = Path(__file__).resolve().parents[2]
STANDIN_KEY_ENV = "LEDGER_TEST_STANDIN_KEY"
"""p2's credential variable: the strict stand-in's Anthropic path requires an x-api-key."""
STANDIN_ENV = {STANDIN_KEY_ENV: "standin-test-key"}


def standin_catalog(standin: StandIn) -> dict[str, Any]:
    """Three providers on the stand-in: p1 (OpenAI format), p2 (Anthropic format), p3 (OpenAI)."""
    return {
        "providers": {
            "p1": {"available": True, "api": "openai-chat", "baseUrl": standin.base_url_openai},
            "p2": {"available": True, "api": "anthropic-messages",
                   "baseUrl": standin.base_url_anthropic, "credentialEnv": STANDIN_KEY_ENV},
            "p3": {"available": True, "api": "openai-chat", "baseUrl": standin.base_url_openai},
        },
        "models": [
            {"provider": "p1", "id": "m1", "contextWindow": 100000, "maxOutputTokens": 1024,
             "pricing": [{"inputUsdPerMTok": 0.1, "outputUsdPerMTok": 0.2}]},
            {"provider": "p2", "id": "m2", "contextWindow": 100000, "maxOutputTokens": 1024,
             "pricing": [{"inputUsdPerMTok": 0.2, "outputUsdPerMTok": 0.4}]},
            {"provider": "p3", "id": "m3", "contextWindow": 100000, "maxOutputTokens": 1024,
             "pricing": [{"inputUsdPerMTok": 0.3, "outputUsdPerMTok": 0.6}]},
        ],
    }


def standin_home(home: Path, standin: StandIn, **policy: Any) -> Path:
    """Write catalog.json and recovery.json (defaultModel p1/m1) into a state directory."""
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "catalog.json").write_text(json.dumps(standin_catalog(standin)))
    keys = {"defaultModel": "p1/m1", "callsPerHour": 500, "sourceCalls": 4, **policy}
    (home / "recovery.json").write_text(json.dumps(keys))
    return home


def open_ledger(home: Path) -> Ledger:
    """A ledger over a state directory written by standin_home (real clock)."""
    return Ledger.open(home, str(home / "ledger.db"), env=STANDIN_ENV)


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for `python -m ledger` subprocesses (the repo on the path)."""
    env = dict(os.environ)
    env.pop("LEDGER_DB", None)
    env.pop("LEDGER_HOME", None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(STANDIN_ENV)
    env.update(extra)
    return env


def worker_argv(home: Path, *args: str) -> list[str]:
    """argv of a `ledger worker run` process."""
    return [sys.executable, "-m", "ledger", "--home", str(home), "worker", "run", *args]


def appending_handler(job: Job) -> HandlerResult:
    """Test handler: echo over real HTTP; on accept, append the source id to $LEDGER_TEST_LOG."""
    result = echo_handler(job)
    if not result.ok:
        return result
    path = os.environ["LEDGER_TEST_LOG"]

    def commit() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{job.source_id}\n".encode())
        finally:
            os.close(fd)

    return HandlerResult(ok=True, input_tokens=result.input_tokens,
                         output_tokens=result.output_tokens, commit=commit)


def db_rows(home: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """Read the ledger file directly (an independent check of what was committed)."""
    conn = sqlite_driver.connect(home / "ledger.db", timeout=10)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def one_item(led: Ledger, source: str, handler: object = echo_handler) -> ItemReport:
    led.add_source(source, f"payload of {source}")
    claim = q.claim(led.db, "w", led.policy.lease_ms)
    assert claim is not None
    assert claim.source_id == source
    return run_item(led, claim, handler)  # type: ignore[arg-type]


def roles(report: ItemReport) -> list[tuple[str, str, str | None]]:
    return [(a.model, a.role.value, a.kind) for a in report.attempts]


def queued_home(path: Path, standin: StandIn, sources: int, **policy: Any) -> Path:
    """A state directory on the stand-in with `sources` queued sources `src-00`, `src-01`, …"""
    home = standin_home(path, standin, **policy)
    led = open_ledger(home)
    for n in range(sources):
        led.add_source(f"src-{n:02d}", f"payload {n}")
    led.close()
    return home


def two_workers(argv: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
    """Run two `worker run --json` processes at once; both exit 0; their summaries."""
    procs = [
        subprocess.Popen([*argv, "--worker-id", f"w{i}"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    return [json.loads(out) for out, _ in outputs]


def assert_each_source_once(
    home: Path, log: Path, standin: StandIn, summaries: list[dict[str, Any]], sources: int
) -> None:
    """Every source was committed, reserved, called and finished exactly once (R-Q-2)."""
    assert sum(s["done"] for s in summaries) == sources
    names = [f"src-{n:02d}" for n in range(sources)]
    assert Counter(log.read_text().split()) == Counter(dict.fromkeys(names, 1))
    per_source = db_rows(home, "SELECT source_id, count(*) FROM reservations GROUP BY source_id")
    assert sorted(per_source) == [(name, 1) for name in names]
    assert db_rows(home, "SELECT count(*) FROM sources WHERE state = 'done'") == [(sources,)]
    assert len(standin.requests) == sources
