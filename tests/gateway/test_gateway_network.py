"""R-GW-2, R-HTTP-3: the gateway's upstream connections on the event loop's own streams
(`ledger.gateway.network`), under the transport it sends through (`upstream.transport`).

Real sockets on 127.0.0.1: a request leaves as one write (head and body), a kept-alive connection
is reused, TLS works against a server whose certificate the client trusts (openssl makes it here),
and the failures are the exception types the gateway classifies (a refused connection is
httpx's ConnectError, as with httpx's own backend).
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpcore
import httpx
import pytest

from ledger.classify import classify_exception
from ledger.gateway import network
from ledger.gateway.upstream import transport

ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
    b'{"ok":true}'
)


@asynccontextmanager
async def _server(tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A server answering every request on a connection with ANSWER; `seen`: each read."""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pending = b""
        try:
            while chunk := await reader.read(65536):
                seen.append(chunk)
                pending += chunk
                while b"\r\n\r\n" in pending:
                    head, _, rest = pending.partition(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                    if len(rest) < length:
                        break
                    pending = rest[length:]
                    writer.write(ANSWER)
        except OSError:
            pass
        finally:  # also when the loop ends first and cancels this handler
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1], seen
    finally:
        server.close()
        await server.wait_closed()


def _pool(ssl_context: ssl.SSLContext | None = None) -> httpcore.AsyncConnectionPool:
    return httpcore.AsyncConnectionPool(ssl_context=ssl_context, network_backend=network.Backend())


def test_a_request_leaves_as_one_write_and_its_connection_is_reused() -> None:
    writes: list[bytes] = []

    async def go() -> list[int]:
        async with _server() as (port, _seen), _pool() as pool:
            statuses = []
            for _ in range(2):
                answer = await pool.request(
                    "POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                    headers={"content-type": "application/json"}, content=b'{"model":"a1"}',
                )  # fmt: skip
                statuses.append(answer.status)
                stream = answer.extensions["network_stream"]
                if not writes:  # record the writes of the connection (reused by the second)
                    _record(stream._writer, writes)
            assert len(pool.connections) == 1  # kept alive and reused
            return statuses

    assert asyncio.run(go()) == [200, 200]
    assert len(writes) == 1  # the second request: head and body in one write
    assert writes[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert writes[0].endswith(b'\r\n\r\n{"model":"a1"}')


def _record(writer: asyncio.StreamWriter, writes: list[bytes]) -> None:
    write = writer.write

    def recorded(data: bytes) -> None:
        writes.append(bytes(data))
        write(data)

    writer.write = recorded  # type: ignore[method-assign, assignment]


def test_held_writes_leave_together_at_the_next_read() -> None:
    """The unit: what httpcore writes is held until it reads, then sent as one write."""

    class Writer:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.sent.append(data)

        async def drain(self) -> None:
            return None

    async def go() -> tuple[list[bytes], bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(b"answer")
        writer = Writer()
        stream = network.Stream(reader, writer)  # type: ignore[arg-type]
        await stream.write(b"head\r\n\r\n")
        await stream.write(b"")
        await stream.write(b"body")
        assert writer.sent == []  # nothing sent before the read
        got = await stream.read(100)
        return writer.sent, got

    sent, got = asyncio.run(go())
    assert sent == [b"head\r\n\r\nbody"]
    assert got == b"answer"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_to_a_server_the_client_trusts(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))

    async def go() -> tuple[int, bytes, bool]:
        async with _server(server_ctx) as (port, _seen), _pool(client_ctx) as pool:
            answer = await pool.request(
                "POST", f"https://localhost:{port}/v1/messages", content=b"{}"
            )
            tls = answer.extensions["network_stream"].get_extra_info("ssl_object") is not None
            return answer.status, answer.content, tls

    assert asyncio.run(go()) == (200, b'{"ok":true}', True)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_an_untrusted_certificate_is_a_connect_error(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def go() -> None:
        async with _server(server_ctx) as (port, _seen), _pool(ssl.create_default_context()) as p:
            await p.request("GET", f"https://localhost:{port}/")

    with pytest.raises(httpcore.ConnectError):
        asyncio.run(go())


def test_a_refused_connection_is_httpx_connect_error_through_the_gateway_transport() -> None:
    async def go() -> None:
        async with _server() as (port, _seen):
            pass  # closed again: nothing listens on the port now
        sent = transport()
        try:
            await sent.handle_async_request(httpx.Request("POST", f"http://127.0.0.1:{port}/"))
        finally:
            await sent.aclose()

    with pytest.raises(httpx.ConnectError) as raised:
        asyncio.run(go())
    assert classify_exception(raised.value).subkind == "connect_error"
