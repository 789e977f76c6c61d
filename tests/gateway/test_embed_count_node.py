"""The official Node SDKs through a real `ledger serve` and the stand-in
(tests/node/embed_count.cjs; `openai` and `@anthropic-ai/sdk` pinned in
tests/node/package-lock.json): `embeddings.create` reserved and settled with the returned usage
(R-FMT-3), `messages.countTokens` forwarded unreserved to an Anthropic route and 501
`not_supported` where no route can count (R-FMT-4); both are R-FMT-5's Node proof. Without node
or the SDKs the tests skip with one line naming why; under CI=true or LEDGER_REQUIRE_CLIENTS=1
they fail."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ledger.standin.extra import count_of
from ledger.standin.server import Scripted, StandIn
from tests.support.embedding_setup import E1_PRICE, embedding_gateway, reservation_rows
from tests.support.gateway_setup import Gateway

NODE_DIR = Path(__file__).parents[1] / "node"
SCRIPT = NODE_DIR / "embed_count.cjs"


def _node() -> str:
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "the Node SDK test needs node on PATH"
    else:
        for package in ("openai", "@anthropic-ai/sdk"):
            if not (NODE_DIR / "node_modules" / package / "package.json").exists():
                missing = f"{package} (Node) is not installed: run `npm ci --prefix tests/node`"
    if missing is not None:
        if os.environ.get("CI") == "true" or os.environ.get("LEDGER_REQUIRE_CLIENTS") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    assert node is not None
    return node


def _run(node: str, gw: Gateway, what: str, model: str) -> dict[str, Any]:
    done = subprocess.run(
        [node, str(SCRIPT), what, gw.url, gw.token, model], cwd=NODE_DIR, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_r_fmt_5_node_sdk_embeddings_create_settles_the_returned_usage(home: Path) -> None:
    node = _node()
    with StandIn({"e1": [Scripted(input_tokens=7)]}) as standin, embedding_gateway(
        home, standin
    ) as gw:
        result = _run(node, gw, "embed", "acme/e1")
        sent = standin.bodies[-1]
    assert result["ok"], result
    assert result["indexes"] == [0, 1]  # one batch, one call
    assert result["lengths"] == [8, 8]  # the SDK decoded the stand-in's vectors
    assert result["model"] == "acme/e1"
    assert result["usage"]["prompt_tokens"] == 7
    assert sent["model"] == "e1"
    assert sent["input"] == ["first text", "second text"]
    (row,) = reservation_rows(home)
    assert (row["model_key"], row["status"]) == ("acme/e1", "succeeded")
    assert row["estimate_micro"] == row["input_bytes"] * E1_PRICE  # no reply allowance (R-FMT-3)
    assert (row["input_tokens"], row["output_tokens"]) == (7, 0)
    assert row["actual_micro"] == row["cost_micro"] == 7 * E1_PRICE  # settled exact


def test_r_fmt_5_node_sdk_count_tokens_forwarded_to_an_anthropic_route(home: Path) -> None:
    node = _node()
    with StandIn() as standin, embedding_gateway(home, standin) as gw:
        result = _run(node, gw, "count", "bolt/b1")
        (request,) = standin.requests
        (body,) = standin.bodies
    assert result["ok"], result
    assert request.path == "/v1/messages/count_tokens"
    assert body["model"] == "b1"
    assert result["inputTokens"] == count_of(body)  # the stand-in's count, passed back
    assert reservation_rows(home) == []  # not a reservation


def test_r_fmt_5_node_sdk_count_tokens_without_an_anthropic_route_is_501(home: Path) -> None:
    node = _node()
    with StandIn() as standin, embedding_gateway(
        home, standin, crossProviderFallback=False
    ) as gw:
        result = _run(node, gw, "count", "acme/a1")  # an OpenAI route, no fallback to bolt
        received = standin.requests
    assert not result["ok"], result
    assert result["status"] == 501
    assert result["error"]["error"]["code"] == "not_supported", result
    assert received == []
