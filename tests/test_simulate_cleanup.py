"""R-SIM-4 (issue 29 item 15): every way `ledger simulate` ends (normal exit, an error, SIGINT,
SIGTERM, SIGHUP) removes the throw-away ledger it made (in /dev/shm or the temporary directory).

The signal cases run a real `ledger simulate` subprocess, find its throw-away ledger among the
files it holds open (/proc/PID/fd), signal it mid-run and check the directory is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.simulate import runner
from ledger.simulate.simulation import simulate
from tests.test_simulate import CATALOG

ROOT = Path(__file__).resolve().parents[1]


def _inputs(tmp_path: Path, count: int) -> tuple[Path, Path]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "catalog.json").write_text(json.dumps(CATALOG))
    (home / "recovery.json").write_text(
        json.dumps({"defaultModel": "alpha/m", "callsPerHour": 1_000_000})
    )
    scenario = tmp_path / "scenario.json"
    document: dict[str, Any] = {
        "format": "ledger-scenario", "version": 1, "start": "2027-01-15T00:00Z", "hours": 2,
        "latency": {"fixedMs": 1000}, "arrivals": [{"at": "00:00", "count": count}],
    }  # fmt: skip
    scenario.write_text(json.dumps(document))
    return home, scenario


def _throwaway_dir(pid: int) -> Path | None:
    """The `ledger-sim-*` directory whose files the process holds open, if any yet."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for name in names:
        try:
            target = Path(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            continue
        for parent in target.parents:
            if parent.name.startswith("ledger-sim-"):
                return parent
    return None


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/PID/fd (Linux)")
@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)]
)
def test_r_sim_4_a_signal_mid_run_removes_the_throwaway_ledger(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    home, scenario = _inputs(tmp_path, 20_000)  # minutes of work: the signal lands mid-run
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledger", "--home", str(home), "simulate", "--trace",
         str(scenario)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 120
        found = None
        while found is None and proc.poll() is None and time.monotonic() < deadline:
            found = _throwaway_dir(proc.pid)
            time.sleep(0.05)
        assert found is not None, "the simulation never opened its throw-away ledger"
        assert found.is_dir()
        time.sleep(0.5)  # well inside the run: the worker loop is draining
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert not found.exists(), "the throw-away ledger was left behind"
    expected = "ledger: interrupted" if sig == signal.SIGINT else "ledger: terminated"
    assert err.splitlines() == [expected]


def test_r_sim_4_normal_end_and_errors_remove_the_throwaway_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(runner, "MEMORY_DIR", scratch)
    _home, scenario = _inputs(tmp_path, 5)
    catalog = Catalog.model_validate(CATALOG)
    policy = Policy.model_validate({"defaultModel": "alpha/m"})
    made: list[Path] = []
    real = runner._throwaway_ledger

    def watched(tmp: Path, *args: Any) -> Any:
        made.append(tmp)
        return real(tmp, *args)

    monkeypatch.setattr(runner, "_throwaway_ledger", watched)
    assert simulate(scenario, policy, catalog).document["current"]["done"] == 5
    assert len(made) == 1
    assert made[0].parent == scratch
    assert list(scratch.iterdir()) == []

    def broken(*_args: Any) -> Any:
        raise RuntimeError("reading the run back failed")

    monkeypatch.setattr(runner, "read_history", broken)
    with pytest.raises(RuntimeError):
        simulate(scenario, policy, catalog)
    assert len(made) == 2
    assert list(scratch.iterdir()) == []
