"""Issue 47: the README's gateway quickstart runs as written: its setup block (the catalog of two
providers, the policy, `config validate`), `ledger serve --listen`, `ledger key create`, and the
Python, Node and curl calls, against a real `ledger serve` whose two providers are the local
stand-in. Only the providers' base URLs, the port and $HOME are the test's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ledger.standin.server import Scripted, StandIn
from tests.docs.pages import fenced, section
from tests.support.serving import running
from tests.support.shell import _shell_env

OPENAI_URL = "https://api.openai.com/v1"
ANTHROPIC_URL = "https://api.anthropic.com"
README_URL = "http://127.0.0.1:8765"
REPLY = "hi from the stand-in"


def _blocks() -> tuple[list[str], str, str]:
    text = section("Gateway quickstart")
    return fenced(text, "sh"), fenced(text, "python")[0], fenced(text, "js")[0]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A user's home with a short path: the README's default state directory under it holds
    the service's unix socket (at most 95 bytes), which pytest-xdist's deep tmp_path overruns."""
    path = Path(tempfile.mkdtemp(prefix="ledger-qs-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_issue47_readme_gateway_quickstart_runs_as_written(short_tmp: Path) -> None:
    tmp_path = short_tmp
    (setup, serve, key, curl), python_code, node_code = _blocks()
    install, *setup_lines = setup.splitlines()
    assert install == "python -m pip install -c constraints.txt -e '.[serve]'"  # CI installs it
    exports, serve_line = serve.strip().splitlines()
    assert exports.startswith("export OPENAI_API_KEY=")
    assert "ANTHROPIC_API_KEY=" in exports
    assert serve_line == "ledger serve --listen 127.0.0.1:8765"
    assert f"export LEDGER_URL={README_URL}" in key
    env = {**_shell_env(tmp_path), "HOME": str(tmp_path / "user")}
    home = tmp_path / "user" / ".local" / "state" / "ledger"  # the README's $LEDGER_HOME
    with StandIn(default=Scripted(text=REPLY)) as standin:
        script = "\n".join(setup_lines)
        assert OPENAI_URL in script
        assert ANTHROPIC_URL in script
        script = script.replace(OPENAI_URL, standin.base_url_openai)
        script = script.replace(ANTHROPIC_URL, standin.base_url_anthropic)
        done = subprocess.run(["bash", "-euc", script], env=env, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert (home / "catalog.json").is_file()
        assert (home / "recovery.json").is_file()
        keys = {"OPENAI_API_KEY": "sk-test-openai", "ANTHROPIC_API_KEY": "sk-ant-test"}
        with running(home, "--listen", "127.0.0.1:0", env=keys) as served:
            assert served.url is not None
            (tmp_path / "example.py").write_text(python_code)
            (tmp_path / "example.mjs").write_text(node_code)
            node = shutil.which("node")
            calls = "\n".join([
                key.replace(README_URL, served.url),
                f'"{sys.executable}" "{tmp_path / "example.py"}"',
                f'"{node}" "{tmp_path / "example.mjs"}"' if node else "",
                curl,
            ])  # fmt: skip
            shell = {**env, "LEDGER_HOME": str(home)}  # the README's terminal
            done = subprocess.run(["bash", "-euc", calls], env=shell, capture_output=True,
                                  text=True, timeout=120, check=False)  # fmt: skip
            assert done.returncode == 0, done.stderr
            printed = done.stdout.splitlines()
            assert printed[: 3 if node else 2] == [REPLY] * (3 if node else 2)
            answer = json.loads("".join(printed[3 if node else 2 :]))
            assert answer["model"] == "anthropic/claude-haiku-4-5"
            assert answer["content"][0]["text"] == REPLY
            auth = {"Authorization": f"Bearer {served.token}"}
            status = httpx.get(served.url + "/v1/status", headers=auth, timeout=30).json()
    asked = [r.model for r in standin.requests]
    # Python's two SDK calls, Node's OpenAI-format call (when node is here), curl's Anthropic one
    assert asked == ["gpt-4.1-mini", "claude-haiku-4-5", *(["gpt-4.1-mini"] if node else []),
                     "claude-haiku-4-5"]  # fmt: skip
    (scope,) = status["scopes"]
    assert (scope["name"], scope["hourly"]["used"]) == ("my-app", len(asked))  # the key's scope
    if node is None:
        pytest.skip("node is not installed: the Python and curl calls were checked, not Node's")
