"""R-GW-1 (issue 31): the page "The gateway from any language" (it was the README's section "Use it
from any language") runs as written. Its Node block
(global `fetch`, no packages) and its curl block are taken from the README and run with `node` and
`bash` against a real `ledger serve` and the stand-in, reading LEDGER_URL, LEDGER_TOKEN and
LEDGER_HOME from the environment as the README says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ledger.standin.server import Scripted, StandIn
from tests.docs.pages import fenced, section
from tests.support.gateway_setup import Gateway, gateway

TEXT = "one two three four five six"


def section_block(language: str) -> str:
    """The fenced block of `language` on the page "The gateway from any language"."""
    blocks = fenced(section("The gateway from any language"), language)
    assert len(blocks) == 1, f"one ```{language} block expected in the section"
    return blocks[0].rstrip("\n")


def _env(gw: Gateway, home: Path) -> dict[str, str]:
    return {**os.environ, "LEDGER_URL": gw.url, "LEDGER_TOKEN": gw.token, "LEDGER_HOME": str(home)}


def test_r_gw_1_readme_node_example_streams_through_the_gateway(home: Path, tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the README's Node example cannot be run")
    script = tmp_path / "example.mjs"  # top-level await: an ES module
    script.write_text(section_block("js") + "\n")
    with StandIn({"a1": [Scripted(text=TEXT, stream_pieces=4)]}) as standin, \
            gateway(home, standin) as gw:  # fmt: skip
        done = subprocess.run(
            [node, str(script)], env=_env(gw, home), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == TEXT
        assert done.stderr.strip() == "answered by acme/a1"
        assert gw.models_asked() == ["a1"]
        assert standin.bodies[0]["stream"] is True
        assert standin.requests[0].headers.get("x-ledger-source") is None  # ours, not forwarded


def test_r_gw_1_readme_node_example_reports_a_refusal_by_its_code(
    home: Path, tmp_path: Path
) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the README's Node example cannot be run")
    script = tmp_path / "example.mjs"
    script.write_text(section_block("js") + "\n")
    with StandIn() as standin, gateway(home, standin, callsPerHour=1) as gw:
        gw.openai().chat.completions.create(
            model="acme/a1", messages=[{"role": "user", "content": "x"}]
        )  # the hour's one call
        done = subprocess.run(
            [node, str(script)], env=_env(gw, home), capture_output=True, text=True, timeout=60
        )
        assert done.returncode != 0
        assert "refused: shared_hourly_budget" in done.stderr
        assert gw.models_asked() == ["a1"]  # nothing more went upstream


def test_r_gw_1_readme_curl_example_answers_on_tcp_and_on_the_socket(home: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the README's curl example cannot be run")
    replies = {"a1": [Scripted(text="from a1")], "b1": [Scripted(text="from b1")]}
    with StandIn(replies) as standin, gateway(home, standin) as gw:
        done = subprocess.run(
            ["bash", "-euc", section_block("sh")],
            env=_env(gw, home), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        first, second = _documents(done.stdout)
        assert first["model"] == "acme/a1"
        assert first["choices"][0]["message"]["content"] == "from a1"
        assert second["model"] == "bolt/b1"
        assert second["content"][0]["text"] == "from b1"
        assert gw.models_asked() == ["a1", "b1"]


def _documents(text: str) -> list[Any]:
    """The JSON documents curl printed one after another."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    at = 0
    while at < len(text.rstrip()):
        while text[at].isspace():
            at += 1
        document, at = decoder.raw_decode(text, at)
        out.append(document)
    return out
