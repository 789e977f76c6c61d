"""The Codex CLI through a real `ledger serve` (R-FMT-5): `codex exec` with a custom provider
(`wire_api = "responses"`, base URL at the gateway, the service token as its key) completes a turn
on a native Responses route and on an OpenAI chat route (translated, R-FMT-2), and a tool-call
turn: the call it asks for is run by Codex and its output comes back in the next request.

Codex is installed from tests/clients/codex/package-lock.json (`npm ci`, in .ci/run). Without
it the test skips with one line naming why; under LEDGER_REQUIRE_CLIENTS=1 (.ci/run) it fails.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import Gateway
from tests.support.responses_setup import responses_gateway

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
CODEX = CLIENTS / "codex" / "node_modules" / ".bin" / "codex"


def _codex() -> Path:
    if CODEX.exists():
        return CODEX
    why = "codex is not installed: run `npm ci --prefix tests/clients/codex`"
    if os.environ.get("LEDGER_REQUIRE_CLIENTS") == "1":
        pytest.fail(why)
    pytest.skip(why)


def _exec(gw: Gateway, home: Path, model: str, prompt: str) -> subprocess.CompletedProcess[str]:
    """One `codex exec` turn against the gateway, its own CODEX_HOME, no user config."""
    codex_home = home / "codex-home"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "ledger"\n'
        "[model_providers.ledger]\n"
        'name = "ledger"\n'
        f'base_url = "{gw.url}/openai/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "LEDGER_GATEWAY_KEY"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )
    work = home / "work"
    work.mkdir(exist_ok=True)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "CODEX_HOME": str(codex_home),
           "LEDGER_GATEWAY_KEY": gw.token}  # fmt: skip
    return subprocess.run(
        [str(_codex()), "exec", "--skip-git-repo-check", "--ephemeral", "-C", str(work), prompt],
        env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
        check=False,
    )  # fmt: skip


def _statuses(home: Path) -> list[tuple[str, str]]:
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT model_key, status FROM reservations ORDER BY id")
        return [(str(m), str(s)) for m, s in rows.all()]


@pytest.mark.parametrize(("model", "path"), [("rapid/r1", "/v1/responses"),
                                             ("acme/a1", "/v1/chat/completions")])  # fmt: skip
def test_codex_exec_turn_r_fmt_5(tmp_path: Path, model: str, path: str) -> None:
    _codex()
    reply = Scripted(text="ledger-says-hello", input_tokens=40, output_tokens=6)
    with StandIn(default=reply) as standin, responses_gateway(tmp_path, standin) as gw:
        done = _exec(gw, tmp_path, model, "say hello")
        paths = [r.path for r in standin.requests]
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ledger-says-hello" in done.stdout
    assert paths == [path]
    assert _statuses(tmp_path) == [(model, "succeeded")]


def test_codex_exec_tool_call_turn_r_fmt_5(tmp_path: Path) -> None:
    """Codex runs the function call the route answers with and sends its output back."""
    _codex()
    call = Scripted(text="", tool_call=("exec_command", '{"cmd": "echo ledger-tool-ran"}'))
    with StandIn({"r1": [call]}, default=Scripted(text="all done")) as standin, \
            responses_gateway(tmp_path, standin) as gw:  # fmt: skip
        done = _exec(gw, tmp_path, "rapid/r1", "run the command")
        bodies = standin.bodies
    assert done.returncode == 0, done.stderr[-2000:]
    assert "all done" in done.stdout
    assert len(bodies) == 2
    outputs = [i for i in bodies[1]["input"] if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["call_standin"]
    assert _statuses(tmp_path) == [("rapid/r1", "succeeded"), ("rapid/r1", "succeeded")]
