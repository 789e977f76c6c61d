"""`ledger serve`: one service per state directory, on a unix socket and optionally loopback TCP.

Invariant: the service holds an exclusive `flock` on `ledger.sock.lock` in the state directory
for its whole life, so a second service on the same directory is refused (exit 4), and a socket
file left by a killed service is known to be stale and replaced. The socket is created mode 0600
(the file permission is the authentication); TCP always needs the bearer token, which is never
logged, printed or written anywhere but its own 0600 file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import json
import math
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http import h11_impl
from uvicorn.protocols.http.h11_impl import H11Protocol

from ledger.api import Ledger
from ledger.errors import ServiceRunningError, UsageError
from ledger.service.app import create_app
from ledger.service.errors import MESSAGES, error_body, error_response

SOCKET_NAME = "ledger.sock"
LOCK_NAME = "ledger.sock.lock"
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL (Linux)
TOKEN_NAME = "ledger.token"  # noqa: S105 - a file name, not a secret
TOKEN_ENV = "LEDGER_TOKEN"  # noqa: S105 - a variable name, not a secret
HEADER_TIMEOUT_S = 10.0
"""A request's headers must arrive within this (a client sending a byte a second is cut off)."""
LIMITS: dict[str, Any] = {
    "timeout_keep_alive": 5,  # idle keep-alive connections are closed after 5 s
    "limit_concurrency": 1000,  # connections + requests in flight; beyond: 503
    "backlog": 2048,
    "h11_max_incomplete_event_size": 16 * 1024,  # request line + headers
}


@dataclass(frozen=True)
class Listen:
    """A TCP address to listen on."""

    host: str
    port: int


def parse_listen(text: str, allow_remote: bool) -> Listen:
    """`HOST:PORT` (`[::1]:PORT` for IPv6); loopback only unless `allow_remote`."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError("--listen takes HOST:PORT, e.g. 127.0.0.1:8765")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError("--listen takes an IP address, e.g. 127.0.0.1:8765") from None
    if not address.is_loopback and not allow_remote:
        raise UsageError("--listen on a non-loopback address needs --allow-remote")
    return Listen(str(address), int(port))


def service_token(state: Path, env: Mapping[str, str]) -> tuple[str, Path | None]:
    """The bearer token: `LEDGER_TOKEN`, else the state directory's token file (made 0600 once)."""
    given = env.get(TOKEN_ENV)
    if given is not None:
        if len(given) < 16 or not given.isprintable() or " " in given:
            raise UsageError(f"{TOKEN_ENV} must be at least 16 printable characters, no spaces")
        return given, None
    path = state / TOKEN_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        token = path.read_text(encoding="ascii").strip()
    else:
        token = secrets.token_urlsafe(32)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(token + "\n")
    if len(token) < 16:
        raise UsageError(f"the token file {path} is too short; delete it to get a new one")
    return token, path


@contextlib.contextmanager
def service_lock(state: Path) -> Iterator[None]:
    """Hold the state directory's service lock, or raise ServiceRunningError (exit 4)."""
    fd = os.open(state / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServiceRunningError() from None
        yield
    finally:
        os.close(fd)  # also releases the lock


def unix_listener(path: Path) -> socket.socket:
    """A listening unix socket at `path`, mode 0600 from birth (a stale file is replaced)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise UsageError(
            f"the state directory's path is too long for a unix socket (at most "
            f"{MAX_SOCKET_PATH - len(SOCKET_NAME) - 1} bytes); use a shorter --home"
        )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # we hold the service lock: whatever is here was left by a dead service
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(LIMITS["backlog"])
    return sock


def tcp_listener(listen: Listen) -> socket.socket:
    """A listening TCP socket (port 0: the kernel picks one; the log line says which)."""
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((listen.host, listen.port))
    except OSError:
        sock.close()
        raise UsageError("--listen: the address cannot be bound (in use or not local)") from None
    sock.listen(LIMITS["backlog"])
    return sock


class Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for each request's headers (slow clients)."""

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def _headers_late(self) -> None:
        """No complete request line and headers in time: a JSON 408, then close."""
        self._header_timer = None
        waiting = self.cycle is None or self.cycle.response_complete
        if not waiting or self.transport.is_closing():
            return
        body = json.dumps(error_body("request_timeout", MESSAGES[408])).encode()
        head = (
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.write(head + body)
        self.transport.close()


async def too_many_connections(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer past `limit_concurrency`: a JSON 503 like every other error, then close."""
    answer = error_response(503, "unavailable", "too many connections; retry shortly")
    answer.headers["connection"] = "close"
    await answer(scope, receive, send)


# uvicorn answers past its concurrency limit with this module-level app (plain text by default)
h11_impl.service_unavailable = too_many_connections  # type: ignore[attr-defined,assignment]


class Server(uvicorn.Server):
    """uvicorn's server; SIGTERM/SIGINT start the graceful stop and the process then exits 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Handle the signals without re-raising them afterwards (uvicorn's default would)."""
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def abandon_stuck_work() -> None:
    """After the grace: exit now rather than wait for a database call still running in a worker
    thread (its transaction is rolled back with the process; its client was answered 503)."""
    main = threading.main_thread()
    if any(t.is_alive() and not t.daemon and t is not main for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(0)


def serve(
    ledger: Ledger,
    *,
    listen: Listen | None,
    grace_s: float,
    announce: Callable[[str], None],
) -> None:
    """Run the service until SIGTERM/SIGINT; in-flight requests get `grace_s` to finish."""
    state = ledger.state.path
    with service_lock(state):
        token, token_file = service_token(state, ledger.env) if listen else (None, None)
        sockets = [unix_listener(state / SOCKET_NAME)]
        try:
            where = [f"unix:{state / SOCKET_NAME}"]
            if listen is not None:
                sockets.append(tcp_listener(listen))
                host, port = sockets[-1].getsockname()[:2]
                shown = f"[{host}]" if ":" in host else host
                where.append(f"http://{shown}:{port}")
            server: Server | None = None

            def draining() -> bool:
                return server is not None and server.should_exit

            app = create_app(ledger, token=token, draining=draining)
            config = uvicorn.Config(
                app,
                http=Protocol,
                lifespan="off",
                access_log=False,
                log_config=None,
                server_header=False,
                date_header=False,
                timeout_graceful_shutdown=math.ceil(grace_s),
                **LIMITS,
            )
            server = Server(config)
            token_note = ""
            if listen is not None:
                token_note = (
                    f" (bearer token from {TOKEN_ENV})"
                    if token_file is None
                    else (f" (bearer token in {token_file})")
                )
            announce(f"ledger serve: listening on {' and '.join(where)}{token_note}")
            server.run(sockets=sockets)
        finally:
            for sock in sockets:
                sock.close()
            with contextlib.suppress(FileNotFoundError):
                (state / SOCKET_NAME).unlink()
