"""A shell environment whose `ledger` is this checkout, for the README examples run as written."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _shell_env(tmp_path: Path) -> dict[str, str]:
    """A fresh state directory and a PATH whose `ledger` is this checkout's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ledger"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ledger "$@"\n')
    wrapper.chmod(0o755)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("LEDGER_") and not key.endswith("_API_KEY")
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        LEDGER_HOME=str(tmp_path / "home"),
        TMPDIR=str(scratch),
    )
    return env
