"""Issue 47: the tutorial's "Your own setup" runs as written: its shell lines in order in one shell,
each ending with the exit code its comment states, and each `<!-- docs-file: NAME -->` JSON block
written to that file of the state directory at its place in the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.docs.pages import section
from tests.docs.test_readme import _run_session, _stated_session
from tests.support.shell import _shell_env

BLOCK = re.compile(
    r"(?:<!-- docs-file: (?P<file>[\w.-]+) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)^```", re.S | re.M
)


def walkthrough(text: str) -> list[tuple[str, int]]:
    """(command, stated exit code) in page order; a file block is one command writing the file."""
    steps: list[tuple[str, int]] = []
    for block in BLOCK.finditer(text):
        if block["file"]:
            json.loads(block["body"])  # a file block is a JSON document as shown
            steps.append((f"cat > \"$LEDGER_HOME/{block['file']}\" <<'DOCS_EOF'\n"
                          f"{block['body']}DOCS_EOF", 0))  # fmt: skip
        elif block["lang"] == "sh":
            steps.extend(_stated_session(block["body"]))
    return steps


def test_issue47_tutorial_setup_runs_as_written(tmp_path: Path) -> None:
    steps = walkthrough(section("Your own setup"))
    assert sum(command.startswith("cat > ") for command, _ in steps) == 4
    assert any(code == 3 for _, code in steps)  # the refusals it shows are refusals
    _run_session(steps, _shell_env(tmp_path), tmp_path / "codes")


def test_issue47_a_wrong_stated_exit_code_fails_the_walkthrough(tmp_path: Path) -> None:
    """The check is real: the same session with one refusal stated as a success fails."""
    steps = walkthrough(section("Your own setup"))
    refusal = next(i for i, (_, code) in enumerate(steps) if code == 3)
    steps[refusal] = (steps[refusal][0], 0)
    with pytest.raises(AssertionError):
        _run_session(steps[: refusal + 1], _shell_env(tmp_path), tmp_path / "codes")
