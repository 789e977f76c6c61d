"""The README is checked against the code: the policy table, the API example, the Quickstart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ledger.policy_table import markdown_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_r_pol_1_readme_table_is_generated_from_the_code() -> None:
    assert markdown_table() in README.read_text()


def test_quickstart_starts_with_the_two_commands() -> None:
    text = README.read_text()
    block = text.split("## Quickstart", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    lines = [line for line in block.strip().splitlines() if line.strip()]
    assert lines[0] == "python -m pip install -e . && ledger demo"
    assert lines[1] == "python -m pip install -e '.[dev]' && python -m pytest"


def test_library_example_runs(tmp_path: Path) -> None:
    text = README.read_text()
    match = re.search(r"## Using it from Python\n\n```python\n(.*?)```", text, re.S)
    assert match is not None
    script = tmp_path / "example.py"
    script.write_text(match.group(1))
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "rate_limit" in result.stdout
