"""R-SRV-9 under a fan-out: every TCP connection is answered, never reset. A burst of callers with
a credential up to the authenticated pool's size (500) is served (200, or a refusal in the
format's shape); past that pool a caller gets 503 `too_many_connections` with Retry-After in its
path's error shape; strangers stay bounded by their own pools (`ledger.service.connections`).

Before: connections past the strangers' pool (100) were closed before their head was read, so a
job fanning out 200 gateway requests with a valid key saw TCP resets.

One real `ledger serve --listen 127.0.0.1:0` per test; raw sockets on asyncio, all connected
before any request is sent, so the service meets them all at once."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.service.connections import CONNECTION_LIMITS, OVERFLOW, TCP, UNAUTHENTICATED
from ledger.standin.server import StandIn
from tests.support.gateway_setup import Gateway, gateway

pytestmark = pytest.mark.slow
STATE_WAIT_S = 120.0
CHAT = json.dumps({"model": "acme/a1", "messages": [{"role": "user", "content": "x"}]}).encode()


@dataclass
class Answer:
    """What one connection got: a status, headers and body, or how it ended without one."""

    status: int | None = None
    headers: dict[str, str] | None = None
    body: bytes = b""
    failure: str | None = None

    def document(self) -> dict[str, object]:
        doc = json.loads(self.body)
        assert isinstance(doc, dict)
        return doc


def _request(method: str, path: str, credential: str | None, body: bytes = b"",
             length: int | None = None) -> bytes:  # fmt: skip
    head = f"{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
    if credential is not None:
        head += f"authorization: Bearer {credential}\r\n"
    if method == "POST":
        head += f"content-type: application/json\r\ncontent-length: {length or len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _parse(data: bytes) -> Answer:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return Answer(failure=f"no answer ({len(data)} bytes)")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


async def _read_all(reader: asyncio.StreamReader) -> Answer:
    data = b""
    try:
        while chunk := await reader.read(65536):
            data += chunk
    except ConnectionResetError:
        return Answer(failure="reset")
    return _parse(data)


async def _fan_out(address: tuple[str, int], requests: list[bytes]) -> list[Answer]:
    """Connect every request's connection first, then send them all, then read every answer."""
    opened = await asyncio.gather(*(asyncio.open_connection(*address) for _ in requests))
    for (_, writer), request in zip(opened, requests, strict=True):
        writer.write(request)
    answers = []
    for reader, writer in opened:
        answers.append(await _read_all(reader))
        writer.close()
    return answers


def _close(opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in opened:
        writer.close()


def _address(gw: Gateway) -> tuple[str, int]:
    host, port = gw.url.removeprefix("http://").split(":")
    return host, int(port)


def _pool_counts(gw: Gateway) -> dict[str, float]:
    with gw.served.client() as http:
        text = http.get("/metrics").text
    found = re.findall(r'^ledger_http_connections\{pool="(\w+)"\} (\S+)$', text, re.M)
    return {pool: float(value) for pool, value in found}


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    give_up = time.monotonic() + STATE_WAIT_S
    while not condition():
        assert time.monotonic() < give_up, f"never happened: {what}"
        time.sleep(0.05)


def _too_many_in_shape(answer: Answer, shape: str) -> None:
    assert answer.status == 503, answer
    assert answer.headers is not None
    assert answer.headers.get("retry-after") == "1"
    doc = answer.document()
    if shape == "anthropic":
        assert doc["type"] == "error"
    error = doc["error"]
    assert isinstance(error, dict)
    assert error["code"] == "too_many_connections"
    if shape == "openai":
        assert {"message", "type", "param", "code"} <= set(error)
    if shape == "json":
        assert set(doc) == {"error"}
        assert set(error) == {"code", "message"}


def _new_key(home: Path) -> str:
    made = CliRunner().invoke(cli, ["--home", str(home), "key", "create", "fan", "--scope",
                                    "team"])  # fmt: skip
    assert made.exit_code == 0, made.output
    return made.stdout.strip()


def test_r_srv_9_five_hundred_keyed_callers_at_once_are_all_answered_never_reset(
    home: Path,
) -> None:
    callers = CONNECTION_LIMITS[TCP]
    policy = {"scopes": {"team": {"callsPerHour": 20}}}
    with StandIn() as standin, gateway(home, standin, **policy) as gw:
        key = _new_key(home)
        request = _request("POST", "/openai/v1/chat/completions", key, CHAT)
        request = request.replace(b"\r\n\r\n", b"\r\nx-ledger-source: fan-out\r\n\r\n", 1)
        answers = asyncio.run(_fan_out(_address(gw), [request] * callers))
        failures = Counter(a.failure for a in answers if a.failure is not None)
        assert not failures, failures  # every connection answered: no reset, no bare close
        statuses = Counter(a.status for a in answers)
        assert set(statuses) <= {200, 429, 503}, statuses
        assert statuses[200] == len(standin.requests) <= 20
        for answer in answers:
            if answer.status == 429:  # a refusal in the format's shape (R-GW-6)
                error = answer.document()["error"]
                assert isinstance(error, dict)
                assert {"message", "type", "param", "code"} <= set(error), error
            elif answer.status == 503:
                _too_many_in_shape(answer, "openai")


def test_r_srv_9_past_the_authenticated_pool_503_too_many_connections_in_shape(
    home: Path,
) -> None:
    async def scenario(gw: Gateway) -> list[Answer]:
        address = _address(gw)
        # holders: authenticated requests whose body never comes (the gate has moved them to
        # the `tcp` pool; each waits for its body)
        hold = _request("POST", "/openai/v1/chat/completions", gw.token, length=100)
        holders = await asyncio.gather(
            *(asyncio.open_connection(*address) for _ in range(CONNECTION_LIMITS[TCP]))
        )
        try:
            for _, writer in holders:
                writer.write(hold)
            await asyncio.to_thread(
                _wait_for, lambda: _pool_counts(gw).get(TCP) == CONNECTION_LIMITS[TCP],
                "the tcp pool full",
            )  # fmt: skip
            past = [
                _request("POST", "/openai/v1/chat/completions", gw.token, CHAT),
                _request("POST", "/anthropic/v1/messages", gw.token, CHAT),
                _request("GET", "/v1/status", gw.token),
            ]
            return await _fan_out(address, past)
        finally:  # closed on the loop even when a check fails: none is left to a later test's gc
            _close(holders)

    with StandIn() as standin, gateway(home, standin) as gw:
        openai_answer, anthropic_answer, v1_answer = asyncio.run(scenario(gw))
        _too_many_in_shape(openai_answer, "openai")
        _too_many_in_shape(anthropic_answer, "anthropic")
        _too_many_in_shape(v1_answer, "json")
        assert not standin.requests
        with gw.served.client() as http:  # the socket's clients were never affected
            assert http.get("/healthz").status_code == 200


def test_r_srv_9_a_flood_of_idle_strangers_stays_bounded_and_is_answered(home: Path) -> None:
    strangers = CONNECTION_LIMITS[UNAUTHENTICATED] + CONNECTION_LIMITS[OVERFLOW]
    extra = 50

    async def scenario(gw: Gateway) -> list[Answer]:
        address = _address(gw)
        idle = await asyncio.gather(
            *(asyncio.open_connection(*address) for _ in range(strangers))
        )
        try:
            await asyncio.to_thread(
                _wait_for,
                lambda: _pool_counts(gw).get(UNAUTHENTICATED, 0)
                + _pool_counts(gw).get(OVERFLOW, 0)
                == strangers,
                "the strangers' pools full",
            )
            past = await _fan_out(address, [b""] * extra)  # past every pool: refused, unread
            counts = await asyncio.to_thread(_pool_counts, gw)
            assert counts[UNAUTHENTICATED] == CONNECTION_LIMITS[UNAUTHENTICATED]
            assert counts[OVERFLOW] == CONNECTION_LIMITS[OVERFLOW]
            with gw.served.client() as http:  # the socket's capacity is untouched
                reserved = http.post("/v1/reserve", json={"source": "socket", "model": "acme/a1"})
                assert reserved.status_code == 200
            return past
        finally:  # closed on the loop even when a check fails: none is left to a later test's gc
            _close(idle)

    with StandIn() as standin, gateway(home, standin) as gw:
        for answer in asyncio.run(scenario(gw)):
            _too_many_in_shape(answer, "json")
