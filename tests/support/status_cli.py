"""`ledger` through click in-process, for the status tests and the ones that read status (health,
labels)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner


def cli(home: Path, *args: str) -> Any:
    from ledger.cli.main import cli as group
    return CliRunner().invoke(group, ["--home", str(home), *args], catch_exceptions=False)


def cli_ok(home: Path, *args: str) -> str:
    result = cli(home, *args)
    assert result.exit_code == 0, result.output
    return str(result.output)


def status_json(home: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(cli_ok(home, "status", "--json"))
    return doc
