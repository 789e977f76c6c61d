"""R-RT-8: `ledger simulate` runs pools through the same code: a candidate policy that changes the
pool's strategy from `primary` to `round-robin` spreads the calls over both accounts while one of
them rate-limits; the output is deterministic (R-SIM-3). The files are the README's example."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from ledger.cli.main import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "routing"


def _simulate(tmp_path: Path) -> dict[str, object]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "catalog.json", home / "catalog.json")
    shutil.copy(EXAMPLES / "primary.json", home / "recovery.json")
    result = CliRunner().invoke(
        cli,
        ["--home", str(home), "simulate", "--trace", str(EXAMPLES / "one-account-rate-limits.json"),
         "--policy", str(EXAMPLES / "round-robin.json"), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc: dict[str, object] = json.loads(result.output)
    return doc


def _calls(run: object) -> dict[str, int]:
    """Calls per model of one run."""
    assert isinstance(run, dict)
    by_model = run["callsByModel"]
    assert isinstance(by_model, dict)
    return {str(k): int(v) for k, v in by_model.items()}


def test_r_rt_8_simulate_compares_round_robin_with_primary(tmp_path: Path) -> None:
    doc = _simulate(tmp_path)
    current, candidate = doc["current"], doc["candidate"]
    primary, spread = _calls(current), _calls(candidate)
    assert primary["acct-a/glm-5.2"] > 2 * primary["acct-b/glm-5.2"]  # backups only after 429s
    assert spread["acct-b/glm-5.2"] > spread["acct-a/glm-5.2"]  # round-robin shares the load
    assert _simulate(tmp_path / "again") == doc  # deterministic (R-SIM-3)
