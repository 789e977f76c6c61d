"""SPEC section 15 (issue 8 item 6): the soak script keeps every invariant under killed and
restarted workers, and its checker really detects a broken budget."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from ledger.api import Ledger
from ledger.store import sqlite_driver
from tests.support.queue_setup import ROOT, cli_env

SCRIPT = ROOT / "scripts" / "soak.py"


def load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak_script", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_soak_60_seconds_keeps_every_invariant(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "60", "--workers", "3", "--json",
         "--home", str(tmp_path / "soak")],
        cwd=ROOT, env=cli_env(), capture_output=True, timeout=240, check=False,
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, doc["violations"]
    assert doc["violations"] == []
    assert doc["kills_survived"] >= 1
    assert doc["attempts"] >= 10
    assert doc["worst_hour"] <= doc["hourly_limit"]


def test_soak_checker_detects_an_hourly_overrun_and_overlapping_attempts(
    tmp_path: Path,
) -> None:
    soak = load_soak()
    home = tmp_path / "h"
    home.mkdir()
    (home / "catalog.json").write_text(json.dumps(
        {"providers": {"p": {"available": True}},
         "models": [{"provider": "p", "id": "m",
                     "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 1}]}]}
    ))
    led = Ledger.open(home, str(home / "ledger.db"), env={})
    led.reserve("s", "p/m")
    led.close()
    policy = {"callsPerHour": 1, "sourceCalls": 4, "sourceModels": 2, "dailyEstimatedUsd": None}
    assert soak.check_invariants(home / "ledger.db", policy)[0] == []
    conn = sqlite_driver.connect(home / "ledger.db")
    with conn:  # a second reservation inside the same hour, overlapping the first attempt
        conn.execute(
            "INSERT INTO reservations (source_id, model_key, provider, role, created_ms, "
            "deadline_ms, input_bytes, status, policy_fp) SELECT source_id, model_key, provider, "
            "role, created_ms + 1, deadline_ms, input_bytes, 'open', policy_fp FROM reservations"
        )
    conn.close()
    violations, figures = soak.check_invariants(home / "ledger.db", policy)
    assert figures["worst_hour"] == 2
    assert any("hourly budget exceeded" in v for v in violations)
    assert any("overlapped" in v for v in violations)
    assert any("hour totals" in v for v in violations)  # the raw row was not counted in its hour
