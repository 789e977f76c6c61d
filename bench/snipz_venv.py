"""A Python >= 3.13 venv with snipz for the scope burst figure (issue 32): a bench-only foreign
tool in an interpreter of its own, never a dependency of ledger (snipz 0.2.0 requires Python
>= 3.13; ledger runs on 3.11).

The venv lives outside the repository, in `$LEDGER_BENCH_CACHE` (default
~/.cache/ledger-bench)/snipz-venv, and is reused by later runs. A full run creates it when a 3.13
interpreter is found (`python3.13` on PATH, else pyenv's); `--quick` (the CI smoke run) only ever
reuses one that already exists. Every failure is a one-line reason for the skipped row.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SNIPZ = "snipz==0.2.0"  # pinned: the figure compares one release
INSTALL_TIMEOUT_S = 600.0


def cache_dir() -> Path:
    """Where bench-only foreign tools are kept, outside the repository."""
    configured = os.environ.get("LEDGER_BENCH_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "ledger-bench"


def venv_python() -> Path:
    """The interpreter of the snipz venv (it may not exist yet)."""
    return cache_dir() / "snipz-venv" / "bin" / "python"


def find_python313() -> str | None:
    """A Python 3.13 interpreter that runs: `python3.13` on PATH, else pyenv's 3.13.x (a pyenv
    shim on PATH fails when 3.13 is not the selected version, so each candidate is tried)."""
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which("python3.13")]
    if versions.is_dir():
        candidates += [str(p) for p in sorted(versions.glob("3.13*/bin/python3.13"), reverse=True)]
    for candidate in candidates:
        if candidate and _runs_313(candidate):
            return candidate
    return None


def _runs_313(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-I", "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 13))"],
            env=_clean_env(), capture_output=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _clean_env() -> dict[str, str]:
    # the 3.13 interpreter must not see this tree's PYTHONPATH or the 3.11 site-packages
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _has_snipz(python: Path) -> bool:
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", "import snipz"], env=_clean_env(),
            capture_output=True, timeout=120,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _last_line(text: bytes) -> str:
    lines = [line.strip() for line in text.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def snipz_python(quick: bool) -> tuple[Path | None, str]:
    """(the venv's interpreter, "") when snipz imports there, else (None, why not)."""
    python = venv_python()
    if python.exists() and _has_snipz(python):
        return python, ""
    if quick:
        return None, f"skipped in --quick mode: no snipz venv at {python.parent.parent} " \
            "(a full run creates it; the smoke run never installs)"
    base = find_python313()
    if base is None:
        return None, "no Python 3.13 interpreter found (python3.13 on PATH or pyenv's)"
    venv = python.parent.parent
    steps = [
        [base, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", SNIPZ],
    ]
    for step in steps:
        try:
            done = subprocess.run(
                step, env=_clean_env(), capture_output=True, timeout=INSTALL_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, f"{' '.join(step[1:3])} failed: {type(error).__name__}"
        if done.returncode != 0:
            return None, f"{' '.join(step[1:4])} failed: {_last_line(done.stderr)}"
    if not _has_snipz(python):
        return None, f"{SNIPZ} installed but does not import under {base}"
    return python, ""
