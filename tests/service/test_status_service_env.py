"""`ledger status` in a shell without a provider's credential variable, while `ledger serve` (which
has it) runs on the same state directory: the variable is missing *in this shell*, not unset
for the ledger; with no service running it is still `set VAR` (R-DIAG-1, issue M-hardening)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ledger.standin.server import StandIn
from tests.support.gateway_setup import gateway

VARIABLE = "BOLT_KEY"  # the stand-in catalog's Anthropic-format providers (the service has it)
IN_THIS_SHELL = f"({VARIABLE} is not set in this shell; the running service reads its own"


def _status(home: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    done = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "status", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_status_says_a_credential_is_missing_in_this_shell_while_the_service_runs(
    home: Path,
) -> None:
    with StandIn() as standin, gateway(home, standin):
        text = _status(home)
        doc = json.loads(_status(home, "--json"))
    assert f"unavailable {IN_THIS_SHELL}" in " ".join(text.split())
    assert f"set {VARIABLE})" not in text
    assert doc["service_elsewhere"] is True
    assert {e["credential_env"] for e in doc["excluded"] if e["reason"] == "unavailable"} == {
        VARIABLE
    }
    stopped = _status(home)  # the service is gone: the shell's view is the ledger's
    assert f"unavailable (set {VARIABLE})" in stopped
    assert "in this shell" not in stopped
    assert json.loads(_status(home, "--json"))["service_elsewhere"] is False
