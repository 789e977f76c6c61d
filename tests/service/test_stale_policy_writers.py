"""Issue 33 (R-HOME-3): after an edit of recovery.json, status warns only about processes that still
write under the old policy, judged from the reservations' stamps (ledger/status.py
`live_other_writers`): real processes, one that stamped and was killed before the edit, one started
before the edit that is still alive and writes after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from freezegun import freeze_time

from ledger.cli.main import cli
from ledger.status.document import LIVE_WRITER_MS
from tests.support.ledgers import write_policy

ROOT = Path(__file__).resolve().parents[2]
# a process that reads recovery.json once at start, reserves a source per line read, says "ok"
WRITER = """
import sys
from ledger.api import Ledger
led = Ledger.open(sys.argv[1])
print(led.fingerprint, flush=True)
for line in sys.stdin:
    led.reserve(line.strip(), "alpha/small")
    print("ok", flush=True)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    return {**env, "PYTHONPATH": str(ROOT)}


def _writer(home: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(home)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=60)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _reserve(proc: subprocess.Popen[str], source: str) -> None:
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(source + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ok"


def _status(home: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "status", "--json"],
        capture_output=True, text=True, env=_env(), check=True, timeout=120,
    )  # fmt: skip
    return dict(json.loads(out.stdout))


def test_r_home_3_issue33_only_a_live_old_policy_process_is_warned_about(home: Path) -> None:
    write_policy(home, callsPerHour=50)
    killed, old_fp = _writer(home)
    alive, alive_fp = _writer(home)  # started before the edit: it keeps running the old policy
    assert alive_fp == old_fp
    try:
        _reserve(killed, "k-1")
        killed.send_signal(signal.SIGKILL)
        _stop(killed)
        write_policy(home, callsPerHour=60)  # the operator edits recovery.json
        subprocess.run(  # and goes on with the CLI: the new policy stamps a reservation
            [sys.executable, "-m", "ledger", "--home", str(home), "reserve", "c-1",
             "--model", "alpha/small"],
            env=_env(), check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        doc = _status(home)
        writers = {w["fingerprint"]: w for w in doc["policy"]["writers"]}
        assert writers[old_fp]["current"] is False  # still listed (24 h) ...
        assert writers[old_fp]["live"] is False  # ... but the process that wrote it is gone
        assert doc["policy"]["warning"] is None
        assert not any("old recovery.json" in w for w in doc["warnings"])
        html = home / "page.html"
        subprocess.run(
            [sys.executable, "-m", "ledger", "--home", str(home), "status", "--html", str(html)],
            env=_env(), check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        assert "STALE" not in html.read_text()
        assert "Stale policy" not in html.read_text()

        _reserve(alive, "a-1")  # the process still running the old file writes again
        doc = _status(home)
        assert {w["fingerprint"]: w["live"] for w in doc["policy"]["writers"]}[old_fp] is True
        assert old_fp in doc["policy"]["warning"]
        assert "restart processes that still run an old recovery.json" in doc["warnings"][0]
        text = subprocess.run(
            [sys.executable, "-m", "ledger", "--home", str(home), "status"],
            env=_env(), check=True, capture_output=True, text=True, timeout=120,
        ).stdout  # fmt: skip
        assert "old recovery.json" in text
        subprocess.run(
            [sys.executable, "-m", "ledger", "--home", str(home), "status", "--html", str(html)],
            env=_env(), check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        assert "STALE" in html.read_text()
    finally:
        _stop(killed)
        _stop(alive)
    # the live one stopped too: LIVE_WRITER_MS after its last stamp it is no longer warned about
    later = datetime.now(UTC) + timedelta(milliseconds=LIVE_WRITER_MS + 60_000)
    with freeze_time(later):
        result = CliRunner().invoke(cli, ["--home", str(home), "status", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["policy"]["warning"] is None
