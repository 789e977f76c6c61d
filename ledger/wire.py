"""`LedgerClient`'s keep-alive HTTP/1.1 connections to `ledger serve` (a unix socket or plain
TCP), framed and parsed by h11.

Why not httpcore's pool, as before: for the same bytes on the wire it cost about 240 µs of the
client's CPU per request here (its pool bookkeeping, request and response models, tracing hooks,
a stream wrapper per call), h11 alone about 40, the socket calls 25; a reserve+settle is two
requests, and the client's CPU is on the critical path of every call. TLS (`https://`) stays on
httpx's transport (certificates, its defaults), where those microseconds do not matter.

Invariants: a request is written at most once: it is tried again on a new connection only when
not one byte of it could be written to a kept connection the service had already closed (its
keep-alive ended); a connection is kept only after a whole answer that leaves it reusable (h11
says both sides are done), is never shared by two requests at once (idle ones wait in a list
under a lock, so threads may share a client), and is dropped when it has been idle for longer
than the service keeps one (or the service has closed it: it reads as ready before a request).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import h11

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


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.h11 = h11.Connection(h11.CLIENT)
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
    of them; `timeout_s` bounds each connect, write and read."""

    def __init__(self, connect: Callable[[], socket.socket], timeout_s: float) -> None:
        self._connect = connect
        self._timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._guard = threading.Lock()

    def request(
        self, method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> Answer:
        """The service's whole answer to one request (ConnectFailed, Broken)."""
        fields = list(headers)
        if body and not any(name.lower() == b"content-length" for name, _ in fields):
            fields.append((b"content-length", str(len(body)).encode()))
        head = h11.Request(method=method, target=target, headers=fields)
        conn, kept = self._checkout()
        try:
            try:
                self._write(conn, head, body)
            except (BrokenPipeError, ConnectionResetError):
                if not kept:
                    raise
                conn.close()  # closed by the service while idle: nothing of this was read
                conn = self._new()
                self._write(conn, head, body)
            answer = self._answer(conn)
        except h11.ProtocolError as error:
            conn.close()
            raise Broken(type(error).__name__) from error
        except OSError as error:
            conn.close()
            raise Broken(type(error).__name__) from error
        except BaseException:
            conn.close()
            raise
        self._checkin(conn)
        return answer

    @staticmethod
    def _write(conn: _Connection, head: h11.Request, body: bytes) -> None:
        """The whole request in one write (the service is woken once per request)."""
        data = conn.h11.send(head) or b""
        if body:
            data += conn.h11.send(h11.Data(data=body)) or b""
        data += conn.h11.send(h11.EndOfMessage()) or b""
        conn.sock.sendall(data)

    def close(self) -> None:
        """Close every idle connection (one in use is closed when its request ends)."""
        with self._guard:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _answer(self, conn: _Connection) -> Answer:
        status = 0
        chunks: list[bytes] = []
        while True:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                conn.h11.receive_data(conn.sock.recv(READ_BYTES))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return Answer(status, b"".join(chunks))
            elif isinstance(event, h11.ConnectionClosed):
                raise Broken("closed before a whole answer")
            # an informational answer (1xx) is skipped

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

    def _checkin(self, conn: _Connection) -> None:
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            conn.h11.start_next_cycle()
            conn.idle_since = time.monotonic()
            with self._guard:
                self._idle.append(conn)
        else:  # `connection: close`, or an answer the service ended early
            conn.close()


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
