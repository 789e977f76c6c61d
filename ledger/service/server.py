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
import re
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

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

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


PROTOCOL_ERRORS: dict[str, tuple[int, str, str]] = {
    "malformed": (400, "bad_request", "malformed HTTP request"),
    "head": (431, "headers_too_large", "the request line and headers are larger than 16 KiB"),
    "coding": (501, "not_implemented", "unsupported transfer encoding"),
    # a bad request is a 4xx (R-SRV-6): RFC 9110's 501 for a method nobody knows is not used
    "method": (400, "bad_request", "unsupported method"),
}
"""The HTTP layer's own errors (R-SRV-9): status, code, message."""
HEAD_SLACK = 16
"""What a head still arriving may hold beyond `MAX_HEAD_BYTES` before it is refused early: the
measure is the method, the target and each header's name and value plus 4, and an incomplete
head's count also holds bytes outside it (`HTTP/1.1`, line ends); the exact measure is checked when
the head is complete."""
METHOD_LEAD = 32
METHOD_TOKEN = re.compile(rb"(?:\r\n)*[-!#$%&'*+.^_`|~0-9A-Za-z]+(?: |$)")
"""A request starting with a method token (RFC 9110 5.6.2) llhttp does not know."""


class _Refused(Exception):
    """Raised from a parser callback: the request is answered with the HTTP layer's error."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class _Answered(Exception):
    """Raised from a parser callback: the connection has its answer; parse no further."""


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


class Protocol(HttpToolsProtocol):
    """uvicorn's httptools (llhttp) protocol plus the service's HTTP-layer rules (R-SRV-6,
    R-SRV-9): a deadline for each request's headers (slow clients); a request line and headers
    over 16 KiB refused (431) however they arrive; the connection pools
    (`ledger.service.connections`: a TCP connection is `unauthenticated`, or past that pool
    `overflow` with one request, and cut after a short deadline until the gate sees its
    credential; past every pool it is answered 503 `too_many_connections`, never reset); the
    HTTP layer's own errors in the JSON shape; its log lines bounded.

    llhttp calls the `on_*` methods from `feed_data` (inside `data_received`); an answer decided
    in one of them is raised out of the parser (`_Refused`, `_Answered`) so that it parses
    nothing more and no application task starts. llhttp has no limit on a head's size: the
    service counts it (`_head`: the parts the callbacks have shown; `_unseen`: bytes of reads in
    which none was shown, i.e. a header still arriving, which httptools holds until it ends)."""

    pools: ConnectionPools = ConnectionPools()  # serve() gives every server its own
    _header_timer: asyncio.TimerHandle | None = None
    _stranger_timer: asyncio.TimerHandle | None = None
    _pool: str | None = None
    _refused = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = HTTP_LOG
        self._in_head = True  # between requests or inside a head
        self._between = True  # no request begun since the last one ended
        self._begun = 0  # requests begun in the read being parsed
        self._lead: bytes | None = None  # the first bytes of the request being read
        self._pending: str | None = None  # an error held until earlier answers are written
        self._head = 0
        self._unseen = 0
        self._shown = False
        self._hosts = 0
        self._codings: list[bytes] | None = None

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
        if self._refused or self._pending is not None or self.transport.is_closing():
            return  # a refused or answered connection's bytes are read and dropped
        self._unset_keepalive_if_required()
        between, self._begun, self._shown = self._between, 0, False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if not isinstance(cause, _Answered):
                self._fail(cause.kind if isinstance(cause, _Refused) else "malformed")
            return
        except httptools.HttpParserInvalidMethodError:
            lead = self._method_lead(data, between)
            self._fail("method" if lead is not None and METHOD_TOKEN.match(lead) else "malformed")
            return
        except httptools.HttpParserError:
            self._fail("malformed")
            return
        if self._in_head and not self._between:
            self._lead = self._method_lead(data, between)
            self._unseen = 0 if self._shown else self._unseen + len(data)
            if self._head + self._unseen > MAX_HEAD_BYTES + HEAD_SLACK:
                self._fail("head")

    def _method_lead(self, data: bytes, between: bool) -> bytes | None:
        """The first bytes of the request being read (its method), when known: it began at the
        start of this read, or in an earlier one (None: it began inside this read, after the
        end of another request)."""
        if between and self._begun <= 1:
            return data[:METHOD_LEAD]
        if not between and self._begun == 0 and self._lead is not None:
            return (self._lead + data)[:METHOD_LEAD]
        return None

    # the parser's callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._shown, self._between = True, True, False
        self._begun += 1
        self._head = self._unseen = self._hosts = 0
        self._codings = None

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._shown = True
        self._head += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._shown = True
        name, value = self.headers[-1]  # lowercased, trailing whitespace off
        self._head += len(name) + len(value) + 4
        if self._head > MAX_HEAD_BYTES:
            raise _Refused("head")
        if name == b"host":
            self._hosts += 1
        elif name == b"transfer-encoding":
            codings = [c.strip().lower() for c in value.split(b",") if c.strip()]
            self._codings = (self._codings or []) + codings

    def on_headers_complete(self) -> None:
        """The head is whole: checked (size, Host, transfer coding) as h11 did before, then the
        request starts (past the socket's pool: a 503 in its path's shape instead)."""
        self._in_head, self._shown = False, True
        self._head += len(self.parser.get_method())
        if self._head > MAX_HEAD_BYTES:
            raise _Refused("head")
        version = self.parser.get_http_version()
        if version not in ("1.0", "1.1") or (version == "1.1" and self._hosts != 1):
            raise _Refused("malformed")  # HTTP/1.x only; RFC 9112 3.2: exactly one Host
        if self.parser.get_method() == b"CONNECT":
            raise _Refused("method")  # no tunnels (llhttp reads it as an upgrade)
        if self._codings is not None and self._codings != [b"chunked"]:
            raise _Refused("coding")  # anything but chunked alone
        if self._pool is None:
            self.logger.warning("a request was refused: too many connections on the socket")
            self._too_many(format_of({"path": self.url.decode("latin-1")}))
            raise _Answered()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, HeadWithBody):
            cycle.transport = HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
            if self._pool == OVERFLOW:  # one answer, unless the gate moves it to `tcp`
                cycle.keep_alive = False

    def on_message_complete(self) -> None:
        self._in_head, self._between, self._lead = True, True, None
        super().on_message_complete()

    # answers

    def _fail(self, kind: str) -> None:
        """The HTTP layer's own errors (malformed request line, bad lengths or chunks, a head
        over 16 KiB, an unsupported coding or method): the JSON error shape, then close (past
        the socket's pool: its 503, the path unknown). An error in a request that follows others
        on the connection (pipelined) waits for their answers, reading stopped; one in the body
        of the request being answered cuts its answer."""
        if self._in_head and self.cycle is not None and not self.cycle.response_complete:
            self._pending = kind
            self.flow.pause_reading()
            return
        if self._pool is None:
            self.logger.warning("a request was refused: too many connections on the socket")
            self._too_many(format_of({"path": ""}))
            return
        self.logger.warning("Invalid HTTP request received.")
        self._answer_and_close(*PROTOCOL_ERRORS[kind])

    def send_400_response(self, msg: str) -> None:
        self._fail("malformed")

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()
        kind = self._pending
        if kind is not None and self.cycle.response_complete and not self.transport.is_closing():
            self._pending = None
            self._fail(kind)

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
        self.transport.write(_answer(status, body))
        self.transport.close()


def _answer(status: int, body: bytes) -> bytes:
    """A whole JSON answer that closes the connection (a 503 also says when to retry)."""
    extra = b"".join(
        f"{name}: {value}\r\n".encode() for name, value in TOO_MANY_HEADERS.items()
        if name != "connection"
    ) if status == 503 else b""
    return (
        STATUS_LINE[status] + b"content-type: application/json\r\nconnection: close\r\n" + extra
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
