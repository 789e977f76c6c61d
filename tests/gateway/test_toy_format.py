"""R-FMT-1 (issue 43): adding a wire format is its module, its tests and a registry line. A format
defined in the tests only (tests/support/toy_format.py), registered here, serves a request end to
end through the real gateway on 127.0.0.1: the gate, the route mounted from the registry, the
reserve, the upstream call translated to an `openai-chat` route of the stand-in (and an
`anthropic-messages` one), the answer translated back, the settle and its attempt row. No line
of `ledger/` names it.

The service's own app (`ledger.service.app.create_app`, what `ledger serve` runs) is served by
uvicorn in a thread of this process: a `ledger serve` subprocess could not see a registration
made in the test."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.gateway.formats import registry
from ledger.service.app import create_app
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import STANDIN_KEY, gateway_catalog
from tests.support.toy_format import TOY

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "toy-format-test-token-0123456789"


def _registered() -> None:
    if registry.by_name(TOY.name) is None:  # once per test process
        registry.register(TOY)


class _Server(uvicorn.Server):
    """uvicorn in a thread: no signal handlers; `ready` is set once it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    def install_signal_handlers(self) -> None:
        pass

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        app: Any = self.config.app
        upstream: Any = getattr(app.state, "gateway_upstream", None)
        if upstream is not None:
            await upstream.aclose()


@contextmanager
def served(home: Path, standin: StandIn) -> Iterator[tuple[str, Ledger]]:
    """The service's app over a ledger of stand-in routes, on a free 127.0.0.1 port."""
    catalog = Catalog.model_validate(gateway_catalog(standin))
    ledger = Ledger.open(home, catalog=catalog, env={"BOLT_KEY": STANDIN_KEY})
    app = create_app(ledger, token=TOKEN)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = _Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        assert server.ready.wait(30), "the in-process service did not start"
        yield f"http://127.0.0.1:{port}", ledger
    finally:
        server.should_exit = True
        thread.join()
        listener.close()
        app.state.group.close()
        ledger.close()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


@pytest.mark.parametrize(("model", "api"), [("acme/a1", "openai-chat"),
                                            ("bolt/b1", "anthropic-messages")])  # fmt: skip
def test_r_fmt_1_a_format_registered_from_the_tests_serves_a_request(
    state: Path, model: str, api: str
) -> None:
    _registered()
    reply = Scripted(text="four", input_tokens=12, output_tokens=3, cache_read_tokens=2)
    with StandIn(default=reply) as standin, served(state, standin) as (url, ledger):
        answer = httpx.post(url + "/toy/v1/complete", timeout=60,
                            headers={"authorization": f"Bearer {TOKEN}"},
                            json={"model": model, "prompt": "two and two?"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"text": "four", "usage": {"input": 14, "output": 3},
                                 "model": model}  # fmt: skip
        assert answer.headers["x-ledger-model"] == model
        assert answer.headers["x-ledger-attempts"] == "1"
        # the upstream got the provider's own format, translated through the internal form
        [sent] = standin.bodies
        if api == "openai-chat":
            assert standin.requests[0].path.endswith("/chat/completions")
            assert sent["messages"] == [{"role": "user", "content": "two and two?"}]
        else:
            assert standin.requests[0].path.endswith("/v1/messages")
            text = {"type": "text", "text": "two and two?"}
            assert sent["messages"] == [{"role": "user", "content": [text]}]
            assert sent["max_tokens"] == 4096  # the reply allowance: the toy asked for none
        with ledger.db.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT status, model_key, role, input_tokens, output_tokens, cache_read_tokens"
                " FROM reservations"
            ).all()
    assert [tuple(r) for r in rows] == [("succeeded", model, "primary", 12, 3, 2)]


def test_r_fmt_1_the_toy_format_is_answered_in_its_own_shape(state: Path) -> None:
    """A refusal of its body and a path under its prefix the gateway lacks: both in the toy's
    error shape (the gate and the endpoint ask the format, R-GW-6)."""
    _registered()
    with StandIn() as standin, served(state, standin) as (url, _):
        auth = {"authorization": f"Bearer {TOKEN}"}
        bad = httpx.post(url + "/toy/v1/complete", json={"model": "acme/a1"}, headers=auth)
        missing = httpx.post(url + "/toy/v1/other", json={}, headers=auth)
        unauthorized = httpx.post(url + "/toy/v1/complete", json={})
    assert (bad.status_code, bad.json()) == (
        400, {"error": "invalid_request", "message": "`prompt` must be a string"})  # fmt: skip
    assert missing.status_code == 404
    assert missing.json() == {"error": "not_found", "message": "no such path in the gateway"}
    assert unauthorized.status_code == 401
    assert set(unauthorized.json()) == {"error", "message"}
    assert standin.requests == []


def test_r_fmt_1_no_line_of_ledger_names_the_toy_format() -> None:
    words = (TOY.name, TOY.prefix, "toy_format", "ToyComplete")
    for path in sorted((ROOT / "ledger").rglob("*.py")):
        text = path.read_text()
        assert not any(w in text for w in words), path
