"""Reading an upstream stream's lines (R-GW-5): the SSE format's line ends (CRLF, LF, a lone CR)
however the reads split them, UTF-8 characters kept whole across reads, and a bound on a line's
length, so an upstream that never ends its line cannot grow the gateway's memory."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.api import Ledger
from ledger.gateway.sse import MAX_LINE_BYTES, Malformed, lines_of
from ledger.standin import Scripted, StandIn
from tests.gateway_setup import gateway


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
    with StandIn(default=huge) as standin, gateway(home, standin) as gw:
        answer = httpx.post(gw.url + "/openai/v1/chat/completions", timeout=60,
                            headers={"authorization": f"Bearer {gw.token}"},
                            json={"model": "acme/a1", "stream": True,
                                  "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_unavailable"
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT status, subkind FROM reservations").all()
    assert rows
    assert {tuple(r) for r in rows} == {("failed", "malformed_reply")}
