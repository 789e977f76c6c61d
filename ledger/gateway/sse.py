"""Server-sent events, read from an upstream stream (R-GW-5).

Pure parsing over lines; `Tracker` keeps what the gateway must know about a stream in flight:
whether its first content event arrived, its finish reason, its usage (prompt-cache tokens too,
read by the provider adapters' own functions, R-GW-5c) and its terminator; the route's wire
format reads each event into it (`WireFormat.observe`).
A malformed event (not JSON where the format says JSON, or larger than MAX_EVENT_BYTES) is
reported, never guessed at.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger.gateway.formats.base import WireFormat

DONE = "[DONE]"
MAX_HELD_EVENTS = 256
"""The most events an upstream stream may send before its first content event (a well-formed
one sends a handful: a role, `message_start`, a block start, pings): past it the stream is
Malformed, so the events the gateway holds back (R-GW-5) cannot grow without bound."""
MAX_LINE_BYTES = 4 * 1024 * 1024
"""The longest line an upstream stream may send (4 MiB, the bound on a request body; a `data:`
line carries one chunk): a longer one is Malformed, so an upstream that never ends its line
cannot grow the gateway's memory without bound."""
MAX_EVENT_BYTES = MAX_LINE_BYTES
"""The most `data:` an upstream event may carry across all its lines (R-GW-5a, the same 4 MiB):
a larger one is Malformed, so an event whose lines never end in a blank line cannot grow the
gateway's memory without bound either."""


@dataclass(frozen=True)
class Event:
    """One server-sent event: its `event:` name (if any) and its parsed `data` (None: [DONE])."""

    name: str | None
    data: Any
    done: bool = False


class Malformed(Exception):
    """An event whose data is not what the format says (a `transport` stream cut, R-GW-5)."""


async def lines_of(
    chunks: AsyncIterator[bytes], limit: int = MAX_LINE_BYTES
) -> AsyncIterator[str]:
    """The lines of an SSE body, as the SSE format ends them (CRLF, LF or a lone CR), each
    decoded as UTF-8 once whole (a character split across reads stays whole); a line longer
    than `limit` bytes raises Malformed."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        start = 0
        while True:
            lf = pending.find(b"\n", start)
            cr = pending.find(b"\r", start, lf if lf >= 0 else len(pending))
            end = cr if cr >= 0 else lf
            if end < 0:
                break
            if end == cr:
                if end + 1 == len(pending):
                    break  # a CR that ends this read: its LF may be in the next
                step = 2 if pending[end + 1] == 0x0A else 1
            else:
                step = 1
            if end - start > limit:  # a whole line can come in one read too
                raise Malformed
            yield pending[start:end].decode("utf-8", "replace")
            start = end + step
        pending = pending[start:]
        if len(pending) > limit:
            raise Malformed
    if pending:
        yield pending.removesuffix(b"\r").decode("utf-8", "replace")


async def events(
    lines: AsyncIterator[str], limit: int = MAX_EVENT_BYTES
) -> AsyncIterator[Event]:
    """The events of an SSE body, one per blank-line-separated block; an event whose `data`
    lines come to more than `limit` bytes (UTF-8, with the newlines that join them) raises
    Malformed once the line that crosses it arrives (R-GW-5a)."""
    name: str | None = None
    data: list[str] = []
    size = 0
    async for line in lines:
        if line == "":
            if data:
                yield _event(name, "\n".join(data))
            name, data, size = None, [], 0
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            # isascii() is a flag in CPython: the usual line is measured without encoding it
            size += 1 + (len(value) if value.isascii() else len(value.encode()))
            if size > limit + 1:  # the first line has no newline before it
                raise Malformed
            data.append(value)
    if data:
        yield _event(name, "\n".join(data))


def _event(name: str | None, text: str) -> Event:
    if text == DONE:
        return Event(name, None, done=True)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise Malformed from None
    if not isinstance(data, dict):
        raise Malformed
    return Event(name, data)


def encode(fmt: WireFormat, event: Event, model_key: str) -> bytes:
    """The event as the caller gets it: `model` is the model key that answers (R-GW-6)."""
    if event.done:
        return f"data: {DONE}\n\n".encode()
    data = fmt.with_model(dict(event.data), model_key)
    text = json.dumps(data, separators=(",", ":"))
    head = f"event: {event.name}\n" if event.name else ""
    return f"{head}data: {text}\n\n".encode()


@dataclass
class Tracker:
    """What the gateway knows of one stream so far."""

    fmt: WireFormat
    content: bool = False
    finish: str | None = None
    terminated: bool = False
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_read_tokens: int | None = None
    error: bool = False
    answer_id: str | None = None  # the answer's own id, where the format keeps answers (R-FMT-2)

    def observe(self, event: Event) -> None:
        """Fold one event in (an event of the wrong shape raises Malformed)."""
        self.fmt.observe(self, event)

    @property
    def usage_known(self) -> bool:
        """Both token counts were read from the stream."""
        return self.input_tokens is not None and self.output_tokens is not None
