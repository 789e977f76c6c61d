"""R-GW-4 (interactive pace): every accepted TCP connection of `ledger serve` has Nagle off.

An answer is written as a head and then a body (a stream as many small chunks). With Nagle on,
each small write after the first waits for the caller's ACK, which a caller delays by up to 40 ms:
on plain asyncio (no uvloop installed, the default install) every gateway stream's first chunk and
every JSON answer's body were held 40 ms. asyncio only switches Nagle off for sockets made with
`IPPROTO_TCP`, and the service makes its own listeners, so the protocol does it itself.

The listener, the protocol class and the event loop are the service's own (no uvloop: the
standard library's loop, the one a default install runs on).
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import uvicorn
from uvicorn.server import ServerState

from ledger.service.connections import ConnectionPools
from ledger.service.server import Listen, Protocol, tcp_listener, unix_listener


async def _accepted_socket(listener: socket.socket) -> int | None:
    """TCP_NODELAY of the server side of one connection the service's protocol accepted on
    `listener` (None: a unix socket)."""

    async def app(scope: object, receive: object, send: object) -> None:  # never called
        raise AssertionError("no request is sent")

    config = uvicorn.Config(app, lifespan="off", log_config=None)
    config.load()
    state = ServerState()
    made: asyncio.Future[asyncio.BaseTransport] = asyncio.get_running_loop().create_future()
    served = type("ServedProtocol", (Protocol,), {"pools": ConnectionPools()})

    class Watched(served):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if not made.done():
                made.set_result(transport)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Watched(config, state, {}), sock=listener)
    try:
        if listener.family == socket.AF_UNIX:
            _, writer = await asyncio.open_unix_connection(listener.getsockname())
        else:
            host, port = listener.getsockname()[:2]
            _, writer = await asyncio.open_connection(host, port)
        transport = await asyncio.wait_for(made, 10)
        sock = transport.get_extra_info("socket")
        writer.close()
        if sock.family == socket.AF_UNIX:
            return None
        return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    finally:
        server.close()
        for t in list(state.connections):
            t.shutdown()
        await server.wait_closed()


def test_accepted_tcp_connection_has_nagle_off_r_gw_4() -> None:
    listener = tcp_listener(Listen("127.0.0.1", 0))
    assert asyncio.run(_accepted_socket(listener)) != 0


def test_unix_socket_connections_are_still_served_r_gw_4(tmp_path: Path) -> None:
    # TCP_NODELAY is TCP's: a unix socket connection is accepted as before, nothing set on it
    listener = unix_listener(tmp_path / "s.sock")
    assert asyncio.run(_accepted_socket(listener)) is None
