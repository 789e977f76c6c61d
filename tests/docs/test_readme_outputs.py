"""Issue 33: every example whose output the README or a page of the site (docs/) shows is run and
compared with what the command prints now, so neither can drift again (issue 47: the blocks moved
to the site's pages and are found there, by their markers, wherever they live).

Each checked block is marked `<!-- readme-check: ID -->` on the line before its fence; its lines
starting with `$ ` are the commands (a trailing `  # comment` is the README's, not the command's),
the lines after each command are what it prints. What is normalised, and why:

- in-process blocks (keys, scopes, cooldowns) run under a frozen clock (2027-01-15T08:00Z, the
  README's times), so no time is normalised; a shown line ending in `...` is an elision and matches
  any printed line starting with the text before it; trailing spaces are ignored;
- `simulate` blocks run as shell commands in a copy of the example directory: the simulation runs
  on a virtual clock with a fixed seed and the policy fingerprints are hashes of the example files,
  so nothing is normalised;
- the Quickstart's demo (`quickstart-demo`) is run and compared in tests/docs/test_readme.py, with
  the demo's temporary directory, its stand-in's port and the measured seconds of its HTTP requests
  normalised (they differ per run); the `…` line stands for the status the demo prints.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from freezegun import freeze_time

from ledger.api import Ledger
from ledger.cli.main import cli
from ledger.learned import read_limits
from ledger.records import Success
from tests.docs.pages import all_text
from tests.support.shell import _shell_env

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(
    r"^<!-- readme-check: (?P<id>[a-z0-9-]+) -->\n```[a-z]*\n(?P<body>.*?)^```", re.M | re.S
)
FENCE = re.compile(r"^```[a-z]*\n(?P<body>.*?)^```", re.M | re.S)
T0 = "2027-01-15T08:00:00Z"


def marked_blocks(text: str) -> dict[str, str]:
    blocks: dict[str, str] = {}
    for match in MARK.finditer(text):
        assert match["id"] not in blocks, f"readme-check {match['id']} marks two blocks"
        blocks[match["id"]] = match["body"]
    return blocks


def _command(line: str) -> str:
    """The command on a `$ ` line, without the README's trailing comment."""
    return re.split(r"\s{2,}#\s", line[2:], maxsplit=1)[0].strip()


def session(body: str) -> list[tuple[str, list[str]]]:
    """(command, the lines the README shows it printing) for each `$ ` line of a block; lines before
    the first `$ ` are what the block's only command printed (a block that shows output alone)."""
    steps: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((_command(line), []))
        else:
            assert steps, f"output before any command in a checked block: {line!r}"
            steps[-1][1].append(line)
    return steps


def assert_same(block_id: str, shown: list[str], printed: list[str]) -> None:
    want = [line.rstrip() for line in shown]
    got = [line.rstrip() for line in printed]
    while got and not got[-1]:
        got.pop()
    assert len(want) == len(got), (block_id, want, got)
    for w, g in zip(want, got, strict=True):
        if w.endswith("...") and g.startswith(w[:-3]):
            continue
        assert w == g, f"README block {block_id}: shows\n  {w!r}\nbut the command prints\n  {g!r}"


# --- blocks run in this process under a frozen clock -------------------------------------------


def _invoke(home: Path, command: str) -> list[str]:
    """Run one README command line in-process; `KEY=$(...)` shows only stderr, as a shell would."""
    captured = re.fullmatch(r"\w+=\$\((.*)\)", command)
    argv = shlex.split(captured[1] if captured else command)
    assert argv[0] == "ledger", command
    result = CliRunner().invoke(cli, ["--home", str(home), *argv[1:]])
    text = result.stderr if captured else result.output
    return text.splitlines()


def _catalog(home: Path, policy: dict[str, object]) -> None:
    result = CliRunner().invoke(cli, ["--home", str(home), "catalog", "init"])
    assert result.exit_code == 0, result.output
    (home / "recovery.json").write_text(json.dumps(policy))


def _setup_keys(home: Path) -> str:
    _catalog(home, {"scopes": {"nightly": {"callsPerHour": 10}}})
    return T0


def _setup_scope_in_flight(home: Path) -> str:
    """Scope team-search allows one open reservation; job-1 holds it from 08:00 (120 s allowed)."""
    _catalog(home, {"scopes": {"team-search": {"inFlight": 1}}})
    with freeze_time(T0):
        for source in ("job-1", "job-2"):
            assert _invoke(home, f"ledger source add {source} --scope team-search")
        _invoke(home, "ledger reserve job-1 --model openai/gpt-4.1-mini")
    return "2027-01-15T08:00:02Z"


def _setup_auth_failure_on_openai(home: Path) -> str:
    """A 401 on openai at 08:00: a 15-minute policy cooldown on the provider."""
    _catalog(home, {})
    with freeze_time(T0):
        runner = CliRunner()
        argv = ["--home", str(home), "reserve", "s1", "--model", "openai/gpt-4.1-mini", "--json"]
        out = runner.invoke(cli, argv)
        rid = json.loads(out.output)["id"]
        settled = runner.invoke(
            cli, ["--home", str(home), "settle", str(rid), "--http-status", "401"]
        )
        assert settled.exit_code == 0, settled.output
    return T0


def _setup_learned_limit(home: Path) -> str:
    """openai/gpt-4.1-mini answered at 08:00 that 1,200 tokens are left until 08:00:20."""
    _catalog(home, {})
    headers = {"x-ratelimit-remaining-tokens": "1200", "x-ratelimit-reset-tokens": "20s"}
    with freeze_time(T0):
        led = Ledger.open(home, env={})
        heard = led.reserve("s1", "openai/gpt-4.1-mini")
        led.settle(heard.id, Success(10, 5, limits=read_limits(headers, led.clock_fn())))
        led.close()
    return "2027-01-15T08:00:01Z"


IN_PROCESS: dict[str, Callable[[Path], str]] = {
    "key-create-list-revoke": _setup_keys,
    "scope-in-flight-refusal": _setup_scope_in_flight,
    "cooldown-set-still-refused": _setup_auth_failure_on_openai,
    "learned-limit-refusal": _setup_learned_limit,
}


@pytest.mark.parametrize("block_id", sorted(IN_PROCESS))
def test_issue33_readme_output_in_process(block_id: str, tmp_path: Path) -> None:
    body = marked_blocks(all_text())[block_id]
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    at = IN_PROCESS[block_id](home)
    with freeze_time(at):
        for command, shown in session(body):
            assert_same(block_id, shown, _invoke(home, command))


# --- blocks run as shell commands in a copy of their example directory ------------------------


def _simulate_dir(tmp_path: Path) -> Path:
    return Path(shutil.copytree(ROOT / "examples" / "simulate", tmp_path / "simulate"))


def _repo_dir(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path / "repo" / "examples")
    return tmp_path / "repo"


IN_SHELL: dict[str, Callable[[Path], Path]] = {
    "simulate-calls-120": _simulate_dir,
    "simulate-anthropic-backup": _simulate_dir,
    "simulate-demo-candidate": _simulate_dir,
    "simulate-learned-limits": _simulate_dir,
    "simulate-token-budget": _simulate_dir,
    "routing-primary-vs-round-robin": _repo_dir,
}


@pytest.mark.parametrize("block_id", sorted(IN_SHELL))
def test_issue33_readme_output_in_shell(block_id: str, tmp_path: Path) -> None:
    body = marked_blocks(all_text())[block_id]
    cwd = IN_SHELL[block_id](tmp_path)
    env = _shell_env(tmp_path)
    for command, shown in session(body):
        result = subprocess.run(
            ["bash", "-c", f"{command} 2>&1"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        assert_same(block_id, shown, result.stdout.splitlines())


# --- the inventory: every block that shows a command's output is checked ----------------------

ELSEWHERE = {"quickstart-demo": "test_issue25_quickstart_demo_runs_and_its_follow_up_commands_work"}


def test_issue33_every_marked_block_is_checked_and_every_shown_output_is_marked() -> None:
    text = all_text()
    marked = marked_blocks(text)
    assert set(marked) == set(IN_PROCESS) | set(IN_SHELL) | set(ELSEWHERE)
    test_readme = (ROOT / "tests" / "docs" / "test_readme.py").read_text()
    for block_id, test_name in ELSEWHERE.items():
        assert f"def {test_name}(" in test_readme
        assert f"readme-check: {block_id} -->" in test_readme
    marked_bodies = set(marked.values())
    for match in FENCE.finditer(text):
        lines = match["body"].splitlines()
        shows_output = any(
            line.startswith("$ ") and i + 1 < len(lines) and not lines[i + 1].startswith("$ ")
            for i, line in enumerate(lines)
        )
        if match.group(0).startswith("```console") or shows_output:
            unchecked = match["body"][:200]
            assert match["body"] in marked_bodies, f"unchecked README output:\n{unchecked}"


def test_issue33_an_edited_readme_output_fails_the_comparison() -> None:
    body = marked_blocks(all_text())["simulate-calls-120"]
    (_, shown), *_ = session(body)
    edited = [line.replace("0.2730", "0.2731") for line in shown]
    assert edited != shown
    with pytest.raises(AssertionError, match=r"0\.2731"):
        assert_same("simulate-calls-120", edited, shown)
