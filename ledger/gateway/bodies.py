"""Reading a request body before any route runs, bounded in size and time (R-SRV-6, R-SRV-9).

Shared by the service's gate (`/v1`, 64 KiB) and the gateway's (4 MiB): a body is read whole, at
most `limit` bytes within `timeout_s`, so no route ever waits on a slow client or holds a large one.
"""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope


async def read_body(scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes | int:
    """The whole body, or the status that refuses it: 400 (a bad Content-Length, or the client
    left), 413 (over `limit`), 408 (not arrived within `timeout_s`)."""
    length = dict(scope["headers"]).get(b"content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        return 413 if length.isdigit() else 400
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):  # the event loop's own: a third of anyio's cost
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return 400  # the client left
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    return 413
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        return 408


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the route the body already read, then reports the disconnect."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
