"""`LedgerClient`'s keep-alive HTTP/1.1 connections to `ledger serve` (a unix socket or plain
TCP): answers parsed by httptools (llhttp, the C parser the service runs on too).

Why not httpcore's pool, as before: for the same bytes on the wire it cost about 240 µs of the
client's CPU per request here (its pool bookkeeping, request and response models, tracing hooks,
a stream wrapper per call); h11 alone about 40, llhttp 2, the socket calls 25. A reserve+settle
is two requests, and the client's CPU is on the critical path of every call. A request is the
client's own fixed head (checked once, when the client is made) with its method, target and
length: nothing of it comes from a caller unchecked. TLS (`https://`) stays on httpx's
transport (certificates, its defaults), where those microseconds do not matter.

Invariants: a request is written at most once: it is tried again on a new connection only when
not one byte of it could be written to a kept connection the service had already closed (its
keep-alive ended); a connection is kept only after a whole answer that leaves it reusable (the
parser says keep-alive and the answer ended at a message boundary), is never shared by two
requests at once (idle ones wait in a list under a lock, so threads may share a client), and is
dropped when it has been idle for longer than the service keeps one (or the service has closed
it: it reads as ready before a request).
"""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httptools

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(rb"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")
_TARGET = re.compile(rb"/[\x21-\x7e]*")
IDLE_S = 4.0
"""A kept connection idle longer than this is dropped, not used: the service closes idle ones
after 5 s, and a request written as it closes could be lost with no answer either way."""
READ_BYTES = 65536


class ConnectFailed(Exception):
    """No connection could be made (nothing was sent)."""


class Broken(Exception):
    """The connection failed (or timed out) once the request may have been sent, or the answer
    was not HTTP: whether the service acted on it is unknown."""


@dataclass(frozen=True)
class Answer:
    """A whole answer: its status and body."""

    status_code: int
    content: bytes


class _Reading:
    """One answer as llhttp reports it (the parser's callbacks)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done = False
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.done = True
        self.keep_alive = self.parser.should_keep_alive()  # reset once this callback returns


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.idle_since = time.monotonic()

    def usable(self) -> bool:
        """Idle briefly and not closed by the service (an idle connection reads as ready only
        when its peer has closed it, or sent what nobody asked for: either way, not usable)."""
        if time.monotonic() - self.idle_since > IDLE_S:
            return False
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        try:
            return not poller.poll(0)  # readable: closed (end of stream) or unasked-for bytes
        except OSError:
            return False

    def close(self) -> None:
        self.sock.close()


class Wire:
    """Connections made by `connect` (which raises OSError when it cannot), each request on one
    of them; `timeout_s` bounds each connect, write and read. `headers` are sent with every
    request (names and values checked here: visible ASCII, values may hold spaces)."""

    def __init__(
        self,
        connect: Callable[[], socket.socket],
        timeout_s: float,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        self._connect = connect
        self._timeout_s = timeout_s
        for name, value in headers:
            if not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
                raise ValueError("a header name or value HTTP cannot carry")
        self._head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        self._idle: list[_Connection] = []
        self._guard = threading.Lock()

    def request(self, method: bytes, target: bytes, body: bytes = b"") -> Answer:
        """The service's whole answer to one request (ConnectFailed, Broken); a body is sent as
        JSON."""
        if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
            raise ValueError("a method or target HTTP cannot carry")
        data = method + b" " + target + b" HTTP/1.1\r\n" + self._head
        if body:
            data += b"content-length: %d\r\ncontent-type: application/json\r\n" % len(body)
        data += b"\r\n" + body
        conn, kept = self._checkout()
        try:
            try:
                conn.sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                if not kept:
                    raise
                conn.close()  # closed by the service while idle: nothing of this was read
                conn = self._new()
                conn.sock.sendall(data)
            answer, reusable = self._answer(conn)
        except httptools.HttpParserError as error:
            conn.close()
            raise Broken(type(error).__name__) from error
        except OSError as error:
            conn.close()
            raise Broken(type(error).__name__) from error
        except BaseException:
            conn.close()
            raise
        if reusable:
            conn.idle_since = time.monotonic()
            with self._guard:
                self._idle.append(conn)
        else:  # `connection: close`, or an answer the service ended by closing
            conn.close()
        return answer

    def close(self) -> None:
        """Close every idle connection (one in use is closed when its request ends)."""
        with self._guard:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    @staticmethod
    def _answer(conn: _Connection) -> tuple[Answer, bool]:
        """The answer, and whether the connection may carry another request. The service frames
        every answer (a length, or chunks), never by closing: a close before its end is Broken.
        No request of the client's asks for an informational (1xx) answer."""
        reading = _Reading()
        while not reading.done:
            data = conn.sock.recv(READ_BYTES)
            if not data:
                raise Broken("closed before a whole answer")
            reading.parser.feed_data(data)
        answer = Answer(reading.parser.get_status_code(), b"".join(reading.chunks))
        return answer, reading.keep_alive

    def _checkout(self) -> tuple[_Connection, bool]:
        while True:
            with self._guard:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._new(), False
            if conn.usable():
                return conn, True
            conn.close()

    def _new(self) -> _Connection:
        try:
            sock = self._connect()
        except OSError as error:
            raise ConnectFailed(type(error).__name__) from error
        sock.settimeout(self._timeout_s)
        return _Connection(sock)


def unix_connector(path: str, timeout_s: float) -> Callable[[], socket.socket]:
    """Connections to a unix socket (a socket whose connect failed is closed)."""

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return sock

    return connect


def tcp_connector(host: str, port: int, timeout_s: float) -> Callable[[], socket.socket]:
    """Connections to a TCP address, Nagle off (a request is one write; its answer is awaited)."""

    def connect() -> socket.socket:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            sock.close()
            raise
        return sock

    return connect
