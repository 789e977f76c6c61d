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
import errno
import fcntl
import ipaddress
import json
import logging
import math
import os
import resource
import secrets
import signal
import socket
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http import h11_impl
from uvicorn.protocols.http.h11_impl import H11Protocol

from ledger.api import Ledger
from ledger.errors import ServiceRunningError, UsageError
from ledger.gateway.errors import TOO_MANY
from ledger.gateway.gate import format_of, too_many_document
from ledger.service.app import create_app
from ledger.service.connections import (
    CONNECTION_LIMITS,
    OVERFLOW,
    TCP,
    UNAUTHENTICATED,
    UNAUTHENTICATED_DEADLINE_S,
    UNIX,
    BoundedLog,
    ConnectionPools,
)
from ledger.service.errors import MESSAGES, TOO_MANY_HEADERS, error_body

SOCKET_NAME = "ledger.sock"
LOCK_NAME = "ledger.sock.lock"
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL (Linux)
TOKEN_NAME = "ledger.token"  # noqa: S105 - a file name, not a secret
TOKEN_ENV = "LEDGER_TOKEN"  # noqa: S105 - a variable name, not a secret
MAX_TOKEN_FILE_BYTES = 4096
HEADER_TIMEOUT_S = 10.0
"""A request's headers must arrive within this (a client sending a byte a second is cut off)."""
MAX_HEAD_BYTES = 16 * 1024
"""A request line and headers larger than this are refused (431), however they arrive."""
LIMITS: dict[str, Any] = {
    "timeout_keep_alive": 5,  # idle keep-alive connections are closed after 5 s
    "limit_concurrency": None,  # the connection pools limit instead (CONNECTION_LIMITS)
    "backlog": 2048,
    "h11_max_incomplete_event_size": MAX_HEAD_BYTES,  # request line + headers
    # behind no proxy: the peer's own address is the client (uvicorn would take it from
    # X-Forwarded-For when the peer is 127.0.0.1, and the pools know connections by it)
    "proxy_headers": False,
}
FILES_BESIDE_CONNECTIONS = 256
"""Descriptors the service needs besides its connections and one upstream connection for each:
listeners, the database and its locks, the log."""
HTTP_LOG = logging.getLogger("ledger.service.http")
HTTP_LOG.addFilter(BoundedLog())


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
        token = read_token_file(path)
    except OSError:
        raise UsageError(f"the token file {path} cannot be created") from None
    else:
        token = secrets.token_urlsafe(32)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(token + "\n")
    return token, path


def read_token_file(path: Path) -> str:
    """An existing token file's token: a regular file of the owner's, mode 0600 (a looser one is
    refused, not tightened: its token may have been read already), ASCII, at least 16
    characters. Opened without following a link and without blocking (a FIFO there never hangs
    the start); whatever is wrong is one line naming the file (UsageError, exit 2)."""
    remedy = "delete it to get a new one"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        what = "is a symlink" if exc.errno == errno.ELOOP else "cannot be read"
        raise UsageError(f"the token file {path} {what}; {remedy}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise UsageError(f"the token file {path} is {kind}; {remedy}")
        if info.st_uid != os.geteuid():
            raise UsageError(f"the token file {path} is owned by another user; {remedy}")
        if info.st_mode & 0o077:
            raise UsageError(
                f"the token file {path} is readable by group or others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}); {remedy} (or chmod 600 it)"
            )
        data = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    except OSError:
        raise UsageError(f"the token file {path} cannot be read; {remedy}") from None
    finally:
        os.close(fd)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise UsageError(f"the token file {path} is not ASCII text; {remedy}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES or not token.isprintable() or " " in token:
        raise UsageError(f"the token file {path} does not hold one token; {remedy}")
    if len(token) < 16:
        raise UsageError(f"the token file {path} is too short; {remedy}")
    return token


def check_state_dir(state: Path) -> None:
    """Before anything is created (R-SRV-1): the socket's path fits a unix socket address, and an
    existing state directory is not writable by group or others (anyone could replace
    `ledger.sock` or plant a token): refused, never tightened (UsageError, exit 2)."""
    if len(os.fsencode(state / SOCKET_NAME)) > MAX_SOCKET_PATH:
        raise UsageError(
            f"the state directory's path is too long for a unix socket (at most "
            f"{MAX_SOCKET_PATH - len(SOCKET_NAME) - 1} bytes); use a shorter --home"
        )
    try:
        info = os.stat(state)
    except FileNotFoundError:
        return  # created 0700 by the ledger
    except OSError:
        raise UsageError(f"the state directory {state} cannot be read") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"the state directory {state} is not a directory")
    if info.st_mode & 0o022:
        raise UsageError(
            f"the state directory {state} is writable by group or others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}; anyone could replace ledger.sock): chmod 700 it"
        )


@contextlib.contextmanager
def service_lock(state: Path) -> Iterator[None]:
    """Hold the state directory's service lock, or raise ServiceRunningError (exit 4). The lock
    file is opened without following a link and without blocking; a symlink, a directory or
    anything but a regular file there is one line naming it (UsageError, exit 2)."""
    path = state / LOCK_NAME
    remedy = "remove it (no service is running on it)"
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        what = {errno.ELOOP: "is a symlink", errno.EISDIR: "is a directory"}
        raise UsageError(
            f"the lock file {path} {what.get(exc.errno or 0, 'cannot be opened')}; {remedy}"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"the lock file {path} is not a regular file; {remedy}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServiceRunningError() from None
        yield
    finally:
        os.close(fd)  # also releases the lock


def unix_listener(path: Path) -> socket.socket:
    """A listening unix socket at `path`, mode 0600 from birth (a stale file is replaced)."""
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


class HeadLimitedConnection(h11.Connection):
    """h11's connection, also refusing a request line and headers over `MAX_HEAD_BYTES` that
    arrived in one read (h11 bounds only a head still incomplete), and remembering the status
    of the last protocol error (the answer `Protocol.send_400_response` writes)."""

    error_status = 400

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.error_status = exc.error_status_hint
            raise
        if isinstance(event, h11.Request) and _head_size(event) > MAX_HEAD_BYTES:
            self.error_status = 431
            raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        return event


def _head_size(request: h11.Request) -> int:
    return len(request.method) + len(request.target) + sum(
        len(name) + len(value) + 4 for name, value in request.headers.raw_items()
    )


PROTOCOL_ERRORS: dict[int, tuple[str, str]] = {
    400: ("bad_request", "malformed HTTP request"),
    431: ("headers_too_large", "the request line and headers are larger than 16 KiB"),
    501: ("not_implemented", "unsupported transfer encoding"),
}
REFUSED_LINGER_S = 1.0
"""A connection refused unread (past every pool) is closed when its caller closes, or this late:
closing with its request unread would reset it, and the caller could lose the answer."""


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Nagle's algorithm off for an accepted TCP connection: an answer is a head and a body (a
    stream, many small chunks), and with Nagle on each small write after the first waits for the
    caller's ACK, which callers delay by up to 40 ms. asyncio turns it off only for sockets made
    with IPPROTO_TCP, and the service makes its own listeners (uvloop turns it off for all)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class HeadWithBody:
    """The transport one answer is written through: its first write (the response head) is held
    until the next (the first body chunk) and both leave as one write, or, when nothing follows
    in this turn of the event loop, alone at the next turn. uvicorn writes a head and each body
    chunk separately, and with Nagle off (`no_delay`) each write is its own segment: one more
    system call, and the caller woken for a head it cannot use without the body."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        """Write `data` (the first write is held; see the class docstring)."""
        if self._first:
            self._first = False
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
            return
        if self._held is not None:
            data, self._held = self._held + data, None
        self._transport.write(data)

    def _flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        """Write what is held, then close."""
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class Protocol(H11Protocol):
    """uvicorn's h11 protocol plus the service's HTTP-layer rules (R-SRV-6, R-SRV-9): a deadline
    for each request's headers (slow clients); the connection pools (`ledger.service.connections`:
    a TCP connection is `unauthenticated`, or past that pool `overflow` with one request, and cut
    after a short deadline until the gate sees its credential; past every pool it is answered 503
    `too_many_connections`, never reset); the HTTP layer's own errors in the JSON shape; its log
    lines bounded."""

    pools: ConnectionPools = ConnectionPools()  # serve() gives every server its own
    _header_timer: asyncio.TimerHandle | None = None
    _stranger_timer: asyncio.TimerHandle | None = None
    _pool: str | None = None
    _refused = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = HTTP_LOG
        self.conn: HeadLimitedConnection = HeadLimitedConnection(h11.SERVER, MAX_HEAD_BYTES)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        tcp = self.server is not None and self.server[1] is not None
        if tcp:
            no_delay(transport)
        for pool in (UNAUTHENTICATED, OVERFLOW) if tcp else (UNIX,):
            if self.pools.join(self, pool, self.client):
                self._pool = pool
                break
        else:  # past the limit: a socket client's request gets a 503 once its head is read
            if tcp:  # past `overflow` too: refused unread
                self.logger.warning("a TCP connection was refused: too many connections")
                self._refuse_unread()
                return
        if tcp:
            self._stranger_timer = self.loop.call_later(
                UNAUTHENTICATED_DEADLINE_S, self._stranger_late
            )
        self._arm()

    def authenticated(self) -> None:
        """The gate saw this TCP connection's credential: the stranger's deadline is off (and
        one that came in through `overflow` may now be kept alive)."""
        if self._stranger_timer is not None:
            self._stranger_timer.cancel()
            self._stranger_timer = None
            if self._pool == OVERFLOW and self.cycle is not None:
                self.cycle.keep_alive = True
        self._pool = TCP

    def data_received(self, data: bytes) -> None:
        if not self._refused:  # a refused connection's request is read and dropped
            super().data_received(data)

    def handle_events(self) -> None:
        if self._pool is None and not self.transport.is_closing():
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                event = None
            if event is not h11.NEED_DATA:
                self.logger.warning("a request was refused: too many connections on the socket")
                target = event.target if isinstance(event, h11.Request) else b""
                self._too_many(format_of({"path": target.decode("latin-1")}))
            return
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, HeadWithBody):
            cycle.transport = HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
            if self._pool == OVERFLOW:  # one answer, unless the gate moves it to `tcp`
                cycle.keep_alive = False

    def send_400_response(self, msg: str) -> None:
        """The HTTP layer's own errors (malformed request line, bad lengths or chunks, a head
        over 16 KiB): the JSON error shape, then close."""
        status = self.conn.error_status
        code, message = PROTOCOL_ERRORS.get(status, PROTOCOL_ERRORS[400])
        self._answer_and_close(status, code, message)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._header_timer, self._stranger_timer):
            if timer is not None:
                timer.cancel()
        self.pools.leave(self, self.client)
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def _waiting(self) -> bool:
        """Between requests or inside a request's head (no request is being answered)."""
        return self.cycle is None or self.cycle.response_complete

    def _headers_late(self) -> None:
        """No complete request line and headers in time: a JSON 408, then close."""
        self._header_timer = None
        if self._waiting() and not self.transport.is_closing():
            self._answer_and_close(408, "request_timeout", MESSAGES[408])

    def _stranger_late(self) -> None:
        """A TCP connection without a credential past its deadline: closed (a JSON 408 if no
        answer is under way)."""
        self._stranger_timer = None
        if self.transport.is_closing():
            return
        if self._waiting():
            self._answer_and_close(408, "request_timeout", MESSAGES[408])
        elif self.cycle is not None:
            self.cycle.keep_alive = False  # its answer is being written: the last one

    def _refuse_unread(self) -> None:
        """Past every pool: a JSON 503 `too_many_connections` at once, the write side closed
        after it; what the caller sends is dropped until it closes (or `REFUSED_LINGER_S`)."""
        self._refused = True
        self.transport.write(_answer(503, json.dumps(error_body(*TOO_MANY)).encode()))
        self.transport.write_eof()
        self._header_timer = self.loop.call_later(REFUSED_LINGER_S, self.transport.abort)

    def eof_received(self) -> None:
        if self._refused:
            self.transport.close()

    def _too_many(self, fmt: Any) -> None:
        """503 `too_many_connections` with Retry-After, in the path's error shape, then close."""
        body = too_many_document(fmt) if fmt is not None else None
        self._answer_and_close(503, *TOO_MANY, body=body)

    def _answer_and_close(
        self, status: int, code: str, message: str, body: bytes | None = None
    ) -> None:
        if body is None:
            body = json.dumps(error_body(code, message)).encode()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's answer, if any, is not written after
            self.cycle.message_event.set()
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.write(_answer(status, body))
        self.transport.close()


def _answer(status: int, body: bytes) -> bytes:
    """A whole JSON answer that closes the connection (a 503 also says when to retry)."""
    reason = h11_impl.STATUS_PHRASES.get(status, b"Error")
    extra = b"".join(
        f"{name}: {value}\r\n".encode() for name, value in TOO_MANY_HEADERS.items()
        if name != "connection"
    ) if status == 503 else b""
    return (
        b"HTTP/1.1 " + str(status).encode() + b" " + reason + b"\r\n"
        b"content-type: application/json\r\nconnection: close\r\n" + extra
        + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


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


def raise_file_limit() -> None:
    """The soft limit on open files raised (up to the hard one) to what the connection pools
    can hold (R-SRV-9): at a common default of 1024, a full `tcp` pool and the strangers' would
    leave no descriptor to accept the socket's clients with."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * sum(CONNECTION_LIMITS.values()) + FILES_BESIDE_CONNECTIONS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


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
    tcp: socket.socket | None,
    grace_s: float,
    announce: Callable[[str], None],
) -> None:
    """Run the service until SIGTERM/SIGINT; in-flight requests get `grace_s` to finish. `tcp`:
    a listener already bound (`tcp_listener`, before the ledger created anything), or None."""
    state = ledger.state.path
    check_state_dir(state)
    raise_file_limit()
    with service_lock(state):
        token, token_file = service_token(state, ledger.env) if tcp else (None, None)
        sockets = [unix_listener(state / SOCKET_NAME)]
        try:
            where = [f"unix:{state / SOCKET_NAME}"]
            if tcp is not None:
                sockets.append(tcp)
                host, port = tcp.getsockname()[:2]
                shown = f"[{host}]" if ":" in host else host
                where.append(f"http://{shown}:{port}")
            server: Server | None = None

            def draining() -> bool:
                return server is not None and server.should_exit

            pools = ConnectionPools()
            hint = f"the service's {TOKEN_ENV}" if token_file is None else str(token_file)
            app = create_app(
                ledger,
                token=token,
                draining=draining,
                token_hint=hint,
                authenticated=pools.authenticated,
                announce=announce,
            )
            app.state.metrics.watch_connections(pools.count, pools.limits)
            config = uvicorn.Config(
                app,
                http=type("ServedProtocol", (Protocol,), {"pools": pools}),
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
            if tcp is not None:
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
