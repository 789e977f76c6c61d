"""A bare relay on the gateway's own stack, for the `gateway` figure's floor: uvicorn, Starlette
and the gateway's own pooled httpx transport (`ledger.gateway.upstream.transport`, sent through
directly, as the gateway does) forwarding a POST's
body upstream and its streamed answer back as it arrives. No ledger, no parsing, no
reservation: what any Python gateway on this stack pays for its second HTTP hop before it does
anything of its own.

Run as `python -m bench.relay_floor UPSTREAM_URL`; it prints the port it listens on (127.0.0.1)
and serves until it is terminated.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

STOP_TIMEOUT_S = 30  # after SIGTERM, then SIGKILL


def _app(upstream: str) -> Any:
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from ledger.gateway.upstream import transport as upstream_transport

    transport = upstream_transport()

    async def relay(request: Request) -> StreamingResponse:
        sent = httpx.Request(
            "POST", upstream, content=await request.body(),
            headers={"content-type": "application/json"},
        )  # fmt: skip
        answer = await transport.handle_async_request(sent)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.aiter_raw():
                    yield chunk
            finally:
                await answer.aclose()

        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/relay", relay, methods=["POST"])])


@contextmanager
def relay_floor(upstream: str) -> Iterator[str]:
    """The relay's URL while it runs in a subprocess."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.relay_floor", upstream],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip())
        yield f"http://127.0.0.1:{port}/relay"
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def main(upstream: str) -> None:
    import uvicorn

    # IPPROTO_TCP: asyncio then turns Nagle off on every accepted connection, as the service does
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(_app(upstream), lifespan="off", access_log=False, log_config=None)
    server = uvicorn.Server(config)
    print(sock.getsockname()[1], flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1])
