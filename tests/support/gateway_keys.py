"""Gateway keys made through the real CLI, as an operator makes them (R-SC-3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _ledger(home: Path, *args: str, db: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI, as an operator runs it."""
    argv = [sys.executable, "-m", "ledger", "--home", str(home)]
    if db is not None:
        argv += ["--db", db]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120)


def _new_key(home: Path, name: str, *extra: str, db: str | None = None) -> str:
    made = _ledger(home, "key", "create", name, "--scope", "slots", *extra, db=db)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()
