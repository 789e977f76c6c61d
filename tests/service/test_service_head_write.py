"""R-GW-4 (interactive pace), R-SRV-3: an answer's head leaves with its first body chunk, in one
write.

uvicorn writes a response head and each body chunk separately; with Nagle off (every accepted
TCP connection, test_service_nodelay.py) each write is its own segment, one more system call and
a wake-up of the caller for a head it cannot use alone. The service's protocol holds the head until
the first body chunk (`HeadWithBody`), and lets it go alone at the event loop's next turn when no
chunk follows at once, so a head is never held back behind a slow body.

The listener, the protocol class and the event loop are the service's own; the writes are those
the accepted connection's transport was asked to make.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from ledger.service.connections import ConnectionPools
from ledger.service.server import Listen, Protocol, tcp_listener

REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"


async def _writes(app: Any) -> tuple[list[bytes], list[tuple[float, bytes]]]:
    """The writes the service's protocol made for one answer of `app`, and what the caller read
    (with the time of each read)."""
    config = uvicorn.Config(app, lifespan="off", log_config=None)
    config.load()
    state = ServerState()
    written: list[bytes] = []
    served = type("ServedProtocol", (Protocol,), {"pools": ConnectionPools()})

    class Recorded(served):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:
            write = transport.write

            def recorded(data: Any) -> None:
                written.append(bytes(data))
                write(data)

            transport.write = recorded  # type: ignore[method-assign]
            super().connection_made(transport)

    listener = tcp_listener(Listen("127.0.0.1", 0))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Recorded(config, state, {}), sock=listener)
    read: list[tuple[float, bytes]] = []
    try:
        host, port = listener.getsockname()[:2]
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(REQUEST)
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            read.append((loop.time(), chunk))
        writer.close()
    finally:
        server.close()
        for t in list(state.connections):
            t.shutdown()
        await server.wait_closed()
    return written, read


def test_a_streamed_answer_s_head_leaves_with_its_first_chunk_r_gw_4() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
        await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"data: second\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    written, read = asyncio.run(_writes(app))
    assert written[0].startswith(b"HTTP/1.1 200 ")
    assert b"data: first" in written[0]  # one write: the head and the first chunk
    assert not any(b"data: first" in w for w in written[1:])
    whole = b"".join(chunk for _, chunk in read)
    assert whole.index(b"data: first") < whole.index(b"data: second")  # nothing reordered


def test_a_json_answer_is_one_write_r_srv_3() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b'{"ok": true}'
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    written, _read = asyncio.run(_writes(app))
    answer = [w for w in written if w]
    assert len(answer) == 1
    assert answer[0].startswith(b"HTTP/1.1 200 ")
    assert answer[0].endswith(b'{"ok": true}')


def test_a_head_is_not_held_behind_a_slow_body_r_gw_4() -> None:
    """No chunk in the same turn: the head goes alone at the next turn, and the caller has it
    well before the body."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        await asyncio.sleep(0.5)
        await send({"type": "http.response.body", "body": b"data: late\n\n", "more_body": False})

    written, read = asyncio.run(_writes(app))
    assert written[0].startswith(b"HTTP/1.1 200 ")
    assert b"data: late" not in written[0]
    first_at, first = read[0]
    assert first.startswith(b"HTTP/1.1 200 ")
    assert b"data: late" not in first
    late_at = next(at for at, chunk in read if b"data: late" in chunk)
    assert late_at - first_at > 0.3  # the head reached the caller while the body waited

