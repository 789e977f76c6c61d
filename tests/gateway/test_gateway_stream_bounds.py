"""R-GW-5a: an upstream event is bounded as a whole (MAX_EVENT_BYTES of `data:` across its lines,
as a line is), not only line by line: `data:` lines that never come to a blank line are a
malformed stream, a failed transport attempt, never a buffer that grows with what the upstream
sends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

from ledger.gateway.sse import MAX_EVENT_BYTES, MAX_LINE_BYTES, Event, Malformed, events
from ledger.standin.server import Scripted
from tests.support.gateway_setup import streamed_attempts

MIB = 1024 * 1024


class _Lines:
    """Lines handed out one by one, counted (so a test sees how far the reader went)."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.lines = lines
        self.read = 0

    async def __aiter__(self) -> AsyncIterator[str]:
        for line in self.lines:
            self.read += 1
            yield line


def _events(lines: _Lines, limit: int = MAX_EVENT_BYTES) -> list[Event]:
    async def go() -> list[Event]:
        return [event async for event in events(lines.__aiter__(), limit)]

    return asyncio.run(go())


def test_r_gw_5a_the_event_bound_is_the_line_bound() -> None:
    assert MAX_EVENT_BYTES == MAX_LINE_BYTES == 4 * MIB


def test_r_gw_5a_data_lines_without_a_blank_line_are_malformed_at_the_bound() -> None:
    # the upstream: 256 lines of 1 MiB each and no blank line; the reader stops at the
    # fourth (4 MiB and the newlines that join them), long before it would hold 256 MiB
    lines = _Lines("data: " + "x" * MIB for _ in range(256))
    with pytest.raises(Malformed):
        _events(lines)
    assert lines.read == 4


def test_r_gw_5a_an_event_up_to_the_bound_is_read_past_it_is_malformed() -> None:
    # JSON across lines: the lines are joined with newlines, which count toward the bound
    head, tail = '{"pad": [', "0]}"
    body = ["0," * 100] * 3
    size = len(head) + sum(len(b) for b in body) + len(tail) + 4  # four joining newlines
    lines = ["data: " + head, *("data: " + b for b in body), "data: " + tail, ""]
    got = _events(_Lines(lines), limit=size)
    assert len(got) == 1
    assert got[0].data["pad"] == [0] * 301
    with pytest.raises(Malformed):
        _events(_Lines(lines), limit=size - 1)


def test_r_gw_5a_the_bound_counts_utf8_bytes_and_starts_again_with_each_event() -> None:
    word = json.dumps({"t": "é" * 10}, ensure_ascii=False)  # 10 two-byte characters
    one = ["data: " + word, ""]
    assert len(_events(_Lines(one * 3), limit=len(word.encode()))) == 3  # each within it
    with pytest.raises(Malformed):
        _events(_Lines(one), limit=len(word.encode()) - 1)  # bytes, not characters


def test_r_gw_5a_an_oversized_event_before_content_fails_the_attempt(home: Path) -> None:
    """Before its first content event: a failed attempt (retried, then the gateway's 502)."""
    big = Scripted(text="x", big_event_mib=5)  # 5 lines of 1 MiB, each under the line bound
    answer, rows = streamed_attempts(home, big)
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_unavailable"
    assert len(rows) > 1  # retried and failed over: each attempt failed the same way
    assert set(rows) == {("failed", "malformed_reply")}
