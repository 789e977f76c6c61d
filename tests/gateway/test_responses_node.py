"""The official Node SDK's `responses.create`, plain and streamed (tests/node/responses.cjs; the
`openai` package pinned in tests/node/package-lock.json), through a real `ledger serve` on a native
Responses route and translated to a chat route (R-FMT-2, R-FMT-5). Without node or the SDK the
test skips with one line naming why; under CI=true or LEDGER_REQUIRE_CLIENTS=1 it fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ledger.standin.server import Scripted, StandIn
from tests.support.responses_setup import responses_gateway

NODE_DIR = Path(__file__).parents[1] / "node"
SCRIPT = NODE_DIR / "responses.cjs"


def _node() -> str:
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "the Node SDK test needs node on PATH"
    elif not (NODE_DIR / "node_modules" / "openai" / "package.json").exists():
        missing = "openai (Node) is not installed: run `npm ci --prefix tests/node`"
    if missing is not None:
        if os.environ.get("CI") == "true" or os.environ.get("LEDGER_REQUIRE_CLIENTS") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    assert node is not None
    return node


@pytest.mark.parametrize("model", ["rapid/r1", "acme/a1"])
def test_node_sdk_responses_plain_and_streamed_r_fmt_5(tmp_path: Path, model: str) -> None:
    node = _node()
    reply = Scripted(text="node hello", input_tokens=11, output_tokens=3, cache_read_tokens=2)
    with StandIn(default=reply) as standin, responses_gateway(tmp_path, standin) as gw:
        done = subprocess.run(
            [node, str(SCRIPT), gw.url, gw.token, model], cwd=NODE_DIR, capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip
        asked = [r.model for r in standin.requests]
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    assert result["plainText"] == result["streamed"] == result["finalText"] == "node hello"
    assert result["plainModel"] == model
    assert (result["first"], result["last"]) == ("response.created", "response.completed")
    assert result["usage"]["input_tokens"] == 13
    assert result["usage"]["input_tokens_details"]["cached_tokens"] == 2
    assert asked == [model.split("/")[1]] * 2
