"""Effort on the wire (R-RT-3): a local HTTP server records every request body; the primary's
request carries no effort, the backup's carries the mapped value (OpenAI `reasoning_effort`,
Anthropic `thinking` with a budget inside the reply allowance); catalog checks of efforts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.errors import ConfigError
from ledger.routing.effort import anthropic_budget
from ledger.store import queue as q
from ledger.targets import Effort
from ledger.worker.handler import echo_handler
from ledger.worker.item import run_item
from tests.support.routing_fixtures import routing_catalog


class Recorder(ThreadingHTTPServer):
    """Answers chat-completions and messages calls; a path in `fail` answers 429 once."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self.fail: set[str] = set()


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.bodies.append((self.path, body))
        account = self.path.split("/")[1]
        if account in self.server.fail:
            self.server.fail.discard(account)
            self._send(429, {"error": {"type": "rate_limit_error"}})
        elif self.path.endswith("/v1/messages"):
            self._send(200, {"content": [{"type": "text", "text": '{"ok": true}'}],
                             "stop_reason": "end_turn",
                             "usage": {"input_tokens": 3, "output_tokens": 4}})  # fmt: skip
        else:
            self._send(200, {"choices": [{"message": {"content": '{"ok": true}'},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 4}})  # fmt: skip

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _ledger(tmp_path: Path, recorder: Recorder, **keys: Any) -> Ledger:
    url = f"http://127.0.0.1:{recorder.server_address[1]}"
    base: dict[str, Any] = {"callsPerHour": 100, "replyTokens": 8192}
    return Ledger.open(
        tmp_path / "home",
        policy=Policy.model_validate({**base, **keys}),
        catalog=Catalog.model_validate(routing_catalog(url)),
        env={},
    )


def _one_item(led: Ledger) -> None:
    led.add_source("s1", "payload")
    claim = q.claim(led.db, "w", led.policy.lease_ms)
    assert claim is not None
    run_item(led, claim, echo_handler)


def test_r_rt_3_effort_reaches_the_wire_only_on_its_route(
    tmp_path: Path, recorder: Recorder
) -> None:
    led = _ledger(
        tmp_path, recorder, defaultModel="acct1/m",
        chains={"acct1/*": [{"model": "claude/sonnet", "effort": "high"}]},
    )  # fmt: skip
    recorder.fail.add("acct1")
    try:
        _one_item(led)
    finally:
        led.close()
    (p1, primary), (p2, backup) = recorder.bodies
    assert p1 == "/acct1/v1/chat/completions"
    assert "reasoning_effort" not in primary
    assert "thinking" not in primary
    assert p2 == "/claude/v1/messages"
    # high = 16384 in the table, clamped inside the reply allowance (8192) less the answer's 1024
    assert backup["thinking"] == {"type": "enabled", "budget_tokens": 8192 - 1024}
    assert backup["thinking"]["budget_tokens"] < backup["max_tokens"] == 8192


def test_r_rt_3_openai_gets_the_mapped_reasoning_effort_and_none_sends_none(
    tmp_path: Path, recorder: Recorder
) -> None:
    led = _ledger(
        tmp_path, recorder, defaultModel="claude/sonnet:none",
        chains={"claude/*": ["acct2/m:xhigh"]},
    )  # fmt: skip
    recorder.fail.add("claude")
    try:
        _one_item(led)
    finally:
        led.close()
    (_, primary), (path, backup) = recorder.bodies
    assert "thinking" not in primary  # `none` sends none
    assert path == "/acct2/v1/chat/completions"
    assert backup["reasoning_effort"] == "high"  # xhigh maps to the API's highest value


def test_r_rt_3_the_thinking_budget_stays_inside_the_reply_allowance() -> None:
    assert anthropic_budget(Effort.LOW, 4096) == 2048
    assert anthropic_budget(Effort.MAX, 4096) == 3072
    assert anthropic_budget(Effort.HIGH, 1500) is None  # no room for the API's minimum budget
    assert anthropic_budget(Effort.NONE, 64000) is None


def test_r_rt_3_effort_on_a_non_reasoning_model_is_a_config_error(tmp_path: Path) -> None:
    from ledger.inert import check_routing

    catalog = Catalog.model_validate(routing_catalog())
    policy = Policy.model_validate({"chains": {"acct1/*": ["acct2/m", "plain/p:high"]}})
    with pytest.raises(ConfigError) as err:
        check_routing(policy, catalog, "recovery.json")
    assert err.value.path == "chains.<key>[1]"
    assert "reasoning" in err.value.rule


def test_r_rt_3_effort_on_an_unknown_reasoning_flag_warns(tmp_path: Path) -> None:
    from ledger.inert import effort_warnings

    doc = routing_catalog()
    doc["models"][5]["reasoning"] = None
    catalog = Catalog.model_validate(doc)
    policy = Policy.model_validate({"defaultModel": "plain/p:low"})
    assert [w.field for w in effort_warnings(policy, catalog)] == ["defaultModel"]


def test_r_rt_3_config_validate_exits_2_for_an_effort_on_a_non_reasoning_model(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from ledger.cli.main import cli

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(routing_catalog()))
    (home / "recovery.json").write_text(json.dumps({"defaultModel": "plain/p:high"}))
    result = CliRunner().invoke(cli, ["--home", str(home), "config", "validate"])
    assert result.exit_code == 2
    assert "defaultModel" in result.output
    assert "plain/p" not in result.output  # never the value
    (home / "recovery.json").write_text(json.dumps({"defaultModel": "plain/p:none"}))
    assert CliRunner().invoke(cli, ["--home", str(home), "config", "validate"]).exit_code == 0
