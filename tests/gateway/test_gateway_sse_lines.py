"""Reading an upstream stream's lines (R-GW-5): the SSE format's line ends (CRLF, LF, a lone CR)
however the reads split them, UTF-8 characters kept whole across reads, and a bound on a line's
length, so an upstream that never ends its line cannot grow the gateway's memory."""

from __future__ import annotations

import asyncio
import http.server
import itertools
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.api import Ledger
from ledger.gateway.formats import Format
from ledger.gateway.sse import (
    MAX_HELD_EVENTS,
    MAX_LINE_BYTES,
    Event,
    Malformed,
    Tracker,
    lines_of,
)
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway_catalog, streamed_attempts
from tests.support.serving import running


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _read(parts: list[bytes], limit: int = 1 << 20) -> list[str]:
    async def go() -> list[str]:
        return [line async for line in lines_of(_chunks(parts), limit)]

    return asyncio.run(go())


def _reference(data: bytes) -> list[str]:
    """The SSE format's own split (its line ends only, never Unicode's other separators)."""
    pieces = re.split(rb"\r\n|\r|\n", data)
    if pieces and pieces[-1] == b"":
        pieces.pop()  # the text ended with a line end: no partial line after it
    return [p.decode("utf-8", "replace") for p in pieces]


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


TEXT = st.lists(
    st.sampled_from(["data: ", "{\"a\": \"é\"}", "\r\n", "\n", "\r", "x", "ключ", "\u2028", ":"]),
    max_size=30,
)


@given(TEXT, st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_r_gw_5_lines_are_the_formats_however_the_reads_split(
    pieces: list[str], cuts: list[int]
) -> None:
    data = "".join(pieces).encode()
    assert _read(_split(data, cuts)) == _reference(data)


def test_r_gw_5_a_crlf_split_across_reads_is_one_line_end() -> None:
    assert _read([b"data: 1\r", b"\ndata: 2\r", b"\r\n"]) == ["data: 1", "data: 2", ""]
    assert _read([b"data: \xd0", b"\xba\n"]) == ["data: к"]  # a character split across reads


def test_r_gw_5_a_line_longer_than_the_bound_is_malformed() -> None:
    with pytest.raises(Malformed):
        _read([b"data: " + b"x" * 100] * 20, limit=1000)
    with pytest.raises(Malformed):  # a whole line in one read
        _read([b"data: " + b"x" * 2000 + b"\n\n"], limit=1000)
    assert _read([b"data: " + b"x" * 100 + b"\n"] * 20, limit=1000) == ["data: " + "x" * 100] * 20


def test_r_gw_5_an_upstream_line_past_the_bound_fails_the_attempt(home: Path) -> None:
    """A stream whose one `data:` line outgrows MAX_LINE_BYTES is a malformed stream before its
    first content event: a failed attempt (retried, then the gateway's 502), never a buffer that
    grows with whatever the upstream sends."""
    huge = Scripted(text="x" * (MAX_LINE_BYTES + 1024), stream_pieces=1)
    answer, rows = streamed_attempts(home, huge)
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_unavailable"
    assert rows
    assert set(rows) == {("failed", "malformed_reply")}


class _Upstream(http.server.BaseHTTPRequestHandler):
    """An OpenAI-format upstream whose stream sends `before` chunks of one delta first."""

    before: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "a1"}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode()

        body = b"".join(chunk(d) for d in self.before) + chunk({"content": "done"})
        body += chunk({}, "stop") + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def _served_with(home: Path, before: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    _Upstream.before = before
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with StandIn() as standin:
            catalog = gateway_catalog(standin)
            catalog["providers"]["acme"]["baseUrl"] = f"http://127.0.0.1:{server.server_port}/v1"
            (home / "catalog.json").write_text(json.dumps(catalog))
            with running(home, "--listen", "127.0.0.1:0") as served:
                assert served.url is not None
                assert served.token is not None
                yield served.url, served.token
    finally:
        server.shutdown()
        server.server_close()


def _stream(url: str, token: str) -> list[dict[str, Any]]:
    body = {"model": "acme/a1", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with httpx.stream("POST", url + "/openai/v1/chat/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {token}"}) as answer:  # fmt: skip
        assert answer.status_code == 200
        return [json.loads(line[6:]) for line in answer.iter_lines()
                if line.startswith("data: {")]  # fmt: skip


def test_r_gw_5_reasoning_deltas_are_content_and_are_relayed_at_once(home: Path) -> None:
    """Before: a reasoning model's `reasoning_content` deltas (OpenAI-compatible providers stream
    them before any text) were not content, so the gateway held them back, and a model that
    reasons longer than `gateway.firstTokenMs` failed as a first-event timeout."""
    assert Tracker(Format.OPENAI).content is False
    for delta, content in (({"role": "assistant"}, False), ({"content": ""}, False),
                           ({"reasoning_content": "hm"}, True), ({"reasoning": "hm"}, True),
                           ({"tool_calls": [{"index": 0}]}, True)):  # fmt: skip
        tracker = Tracker(Format.OPENAI)
        tracker.observe(Event(None, {"choices": [{"delta": delta}]}))
        assert tracker.content is content, delta
    with _served_with(home, [{"role": "assistant"}, {"reasoning_content": "thinking"}]) as (u, t):
        chunks = _stream(u, t)
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    assert {"reasoning_content": "thinking"} in deltas  # passed through as sent


def test_r_gw_5_a_stream_holding_back_too_many_events_is_malformed(home: Path) -> None:
    """MAX_HELD_EVENTS events without content: a failed attempt, never an unbounded hold."""
    before = [{"role": "assistant"}] * (MAX_HELD_EVENTS + 10)
    with _served_with(home, before) as (url, token):
        _stream(url, token)  # answered by the backup the table permits, or the gateway's 502
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT status, subkind FROM reservations WHERE model_key = 'acme/a1'"
        ).all()
    assert rows
    assert {tuple(r) for r in rows} == {("failed", "malformed_reply")}
