"""Issue 14: nothing heavy runs while the write lock is held.

A fresh interpreter runs real CLI commands (the reserve path a cron job takes, and the settle and
operator paths) with an audit hook recording every module imported while this process holds the
write lock. A CLI process spends most of its CPU importing; all of that must happen before it
queues for the lock, never inside the transaction that every other writer waits for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.api import Ledger
from tests.support.ledgers import TEST_CATALOG
from tests.support.procs import write_home

# Runs in a fresh interpreter: nothing of the ledger is imported before the commands run.
CHILD = r"""
import contextlib, json, sys

inside = []
imported = []
def hook(event, args):
    if event == "import" and inside:
        imported.append((inside[-1], args[0]))
sys.addaudithook(hook)

from ledger.store import writelock
original = writelock.WriteLock.held

@contextlib.contextmanager
def held(self):
    with original(self) as locked:
        inside.append(" ".join(sys.argv_cmd))
        try:
            yield locked
        finally:
            inside.pop()

writelock.WriteLock.held = held

from ledger.cli.main import cli

home = sys.argv[1]
commands = json.loads(sys.argv[2])
codes = []
for command in commands:
    sys.argv_cmd = command
    try:
        cli.main(["--home", home, *command], prog_name="ledger", standalone_mode=False)
        codes.append(0)
    except SystemExit as stop:
        codes.append(stop.code)
    except Exception as error:
        codes.append(type(error).__name__)
print(json.dumps({"codes": codes, "imported": imported}))
"""

# Each list is run in its own fresh interpreter (the first use of each path imports lazily).
SCENARIOS = {
    "reserve then settle ok": [
        ["reserve", "s1", "--model", "alpha/small", "--request-id", "r1"],
        ["settle", "1", "--ok", "--input-tokens", "10", "--output-tokens", "5", "--finish"],
    ],
    "reserve then a provider failure": [
        ["reserve", "s2", "--model", "alpha/small"],
        ["settle", "1", "--http-status", "429", "--retry-after", "30"],
        ["reserve", "s2", "--model", "beta/mid", "--after", "1"],
    ],
    "reserve then a reported kind": [
        ["reserve", "s3", "--model", "alpha/small"],
        ["settle", "1", "--kind", "invalid_output"],
    ],
    "operator writes": [
        ["source", "add", "s4"],
        ["source", "pause", "s4"],
        ["source", "resume", "s4"],
        ["cooldown", "set", "alpha", "1h", "--reason", "maintenance"],
        ["cooldown", "clear", "alpha"],
        ["source", "done", "s4"],
    ],
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_issue14_no_module_is_imported_while_the_write_lock_is_held(
    tmp_path: Path, scenario: str
) -> None:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG)
    Ledger.open(home, env={}).close()
    commands = SCENARIOS[scenario]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(home), json.dumps(commands)],
        capture_output=True, text=True, timeout=120, check=True,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    assert all(code in (0, 3) for code in report["codes"]), (report["codes"], done.stderr)
    assert report["imported"] == []


def test_issue14_the_import_probe_sees_an_import_under_the_lock(tmp_path: Path) -> None:
    """The probe itself works: a module first imported inside the transaction is reported."""
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG)
    Ledger.open(home, env={}).close()
    child = CHILD.replace(
        "        try:\n            yield locked",
        "        try:\n            import colorsys  # noqa\n            yield locked",
    )
    assert child != CHILD
    done = subprocess.run(
        [sys.executable, "-c", child, str(home), json.dumps(SCENARIOS["operator writes"][:1])],
        capture_output=True, text=True, timeout=120, check=True,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    assert ["source add s4", "colorsys"] in report["imported"]
