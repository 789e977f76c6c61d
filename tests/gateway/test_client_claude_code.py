"""R-FMT-5 with the real Claude Code CLI (`claude -p`, pinned in tests/clients/claude/
package-lock.json, installed by `npm ci` in .ci/run): one turn on an Anthropic route, its
`anthropic-beta` flags forwarded only as the catalog allows, and one on an OpenAI-format route,
through a real `ledger serve` and the stand-in, offline (no telemetry, no update check).

Under LEDGER_REQUIRE_CLIENTS=1 (set by .ci/run) a missing client fails; elsewhere the test
skips, saying why in one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ledger.standin.server import Scripted, StandIn
from tests.support.embedding_setup import ALLOWED_BETA, embedding_gateway, reservation_rows

CLIENT_DIR = Path(__file__).resolve().parents[1] / "clients" / "claude"
ANSWER = "pong from the stand-in"
OFFLINE = {  # Claude Code's own switches: nothing but the model calls leaves the machine
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


def claude_binary() -> Path:
    """The CLI's native binary from the npm install (the platform package's own copy when the
    wrapper's postinstall did not put it in place), or a skip/failure naming what is missing."""
    modules = CLIENT_DIR / "node_modules" / "@anthropic-ai"
    wrapper = CLIENT_DIR / "node_modules" / ".bin" / "claude"
    found = [*sorted(modules.glob("claude-code-*/claude")), wrapper]
    for path in found:
        if path.is_file() and os.access(path, os.X_OK) and path.stat().st_size > 1_000_000:
            return path
    missing = f"Claude Code is not installed: run `npm ci --prefix {CLIENT_DIR}`"
    if os.environ.get("LEDGER_REQUIRE_CLIENTS") == "1":
        pytest.fail(missing)
    pytest.skip(missing)


def run_claude(binary: Path, base_url: str, key: str, model: str, scratch: Path) -> str:
    """`claude -p` against the gateway with a fresh home; its stdout (asserts it succeeded)."""
    scratch.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),
        "CLAUDE_CONFIG_DIR": str(scratch / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        **OFFLINE,
    }
    done = subprocess.run(
        [str(binary), "-p", "say pong", "--model", model],
        env=env, cwd=scratch, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def test_r_fmt_5_claude_code_completes_a_turn_on_an_anthropic_and_an_openai_route(
    home: Path, tmp_path: Path
) -> None:
    binary = claude_binary()
    with StandIn(default=Scripted(text=ANSWER)) as standin, embedding_gateway(
        home, standin
    ) as gw:
        url = gw.url + "/anthropic"
        anthropic_turn = run_claude(binary, url, gw.token, "bolt/b1", tmp_path / "a")
        on_anthropic = [(r.path, r.model, r.headers.get("anthropic-beta"))
                        for r in standin.requests]  # fmt: skip
        openai_turn = run_claude(binary, url, gw.token, "acme/a1", tmp_path / "o")
        on_openai = [(r.path, r.model) for r in standin.requests[len(on_anthropic) :]]
    assert ANSWER in anthropic_turn
    assert ANSWER in openai_turn
    turns = [row for row in on_anthropic if row[0] == "/v1/messages"]
    assert turns, on_anthropic
    # Claude Code asks for several betas; bolt's catalog entry allows one (R-FMT-4)
    assert {beta for _, _, beta in turns} == {ALLOWED_BETA}
    assert ("/v1/chat/completions", "a1") in on_openai  # translated (R-GW-3, R-FMT-4)
    assert all(path != "/v1/messages" for path, _ in on_openai)
    statuses = {(r["model_key"], r["status"]) for r in reservation_rows(home)}
    assert statuses == {("bolt/b1", "succeeded"), ("acme/a1", "succeeded")}
