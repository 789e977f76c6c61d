"""R-SRV-7: `LedgerClient`'s own HTTP/1.1 connections (ledger/wire.py), against a scripted peer.

The real service is what the client tests talk to; this peer does what the service rarely does
on cue (closes a kept connection, ends an answer early, answers in chunks), on a real unix socket
with h11 on its side, so each rule of the module's invariant is seen to hold.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import h11
import pytest

from ledger import wire
from ledger.wire import Broken, ConnectFailed, Wire, unix_connector

Handler = Callable[[int, h11.Request, bytes], list[h11.Event] | None]
"""(connection number, request, body) -> the events to answer with; None: close unanswered."""


class Peer:
    """A unix-socket server; each connection on its own thread, requests answered by `handler`
    until it says close. Records the connections made and every raw read."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.connections = 0
        self.reads: list[bytes] = []
        self.clients: list[Wire] = []
        self.serving: list[threading.Thread] = []
        self.close_after_answer = False  # close each connection once it has answered
        self.closed = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            number = self.connections
            serving = threading.Thread(target=self._serve, args=(sock, number), daemon=True)
            self.serving.append(serving)
            serving.start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        with sock, suppress(OSError):  # the client went away: so does this connection
            self._answer(sock, number)

    def _answer(self, sock: socket.socket, number: int) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            request: h11.Request | None = None
            body = b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = sock.recv(65536)
                    self.reads.append(data)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
            assert request is not None
            events = self.handler(number, request, body)
            if events is None:
                return
            for answer in events:
                sock.sendall(conn.send(answer) or b"")
            if self.close_after_answer:
                sock.close()
                self.closed.set()
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    def close(self) -> None:
        """Close the clients (their connections end), stop accepting, and wait for every thread
        of the peer: none is left behind in the test process."""
        for client in self.clients:
            client.close()
        with suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self.listener.close()
        self.thread.join(10)
        for serving in self.serving:
            serving.join(10)
        assert not self.thread.is_alive()
        assert not any(serving.is_alive() for serving in self.serving)


@contextmanager
def peer(tmp_path: Path, handler: Handler) -> Iterator[Peer]:
    server = Peer(tmp_path / "p.sock", handler)
    try:
        yield server
    finally:
        server.close()


def ok(body: bytes, *extra: tuple[str, str]) -> list[h11.Event]:
    headers = [("content-length", str(len(body))), *extra]
    return [h11.Response(status_code=200, headers=headers), h11.Data(data=body),
            h11.EndOfMessage()]


def echo(_number: int, request: h11.Request, body: bytes) -> list[h11.Event]:
    return ok(request.method + b" " + request.target + b" " + body)


HEADERS = [(b"host", b"ledger")]


def _wire(server: Peer) -> Wire:
    server.clients.append(Wire(unix_connector(str(server.path), 10.0), 10.0, HEADERS))
    return server.clients[-1]


def test_r_srv_7_a_connection_is_kept_and_a_request_leaves_in_one_write(tmp_path: Path) -> None:
    with peer(tmp_path, echo) as server:
        client = _wire(server)
        for i in range(5):
            answer = client.request(b"POST", b"/v1/reserve", b'{"i": %d}' % i)
            assert answer.status_code == 200
            assert answer.content == b'POST /v1/reserve {"i": %d}' % i
        client.close()
        assert server.connections == 1
        whole = [r for r in server.reads if r]
        assert len(whole) == 5  # head and body in one read each
        assert all(r.endswith(b"}") for r in whole)


def test_r_srv_7_a_kept_connection_the_service_closed_is_not_used(tmp_path: Path) -> None:
    """The service closes a connection after its answer without saying so (its keep-alive
    ended): the next request goes on a new connection and is answered, never `Broken`."""

    def number(number: int, request: h11.Request, body: bytes) -> list[h11.Event]:
        return ok(b"%d" % number)

    with peer(tmp_path, number) as server:
        server.close_after_answer = True
        client = _wire(server)
        assert client.request(b"GET", b"/a", b"").content == b"1"
        assert server.closed.wait(10)
        assert client.request(b"GET", b"/b", b"").content == b"2"
        assert server.connections == 2


def test_r_srv_7_an_idle_connection_past_the_keep_alive_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "IDLE_S", 0.0)
    with peer(tmp_path, echo) as server:
        client = _wire(server)
        client.request(b"GET", b"/a", b"")
        client.request(b"GET", b"/b", b"")
        assert server.connections == 2


def test_r_srv_7_connection_close_and_chunked_answers(tmp_path: Path) -> None:
    def chunked(number: int, request: h11.Request, body: bytes) -> list[h11.Event]:
        return [
            h11.Response(status_code=503, headers=[("transfer-encoding", "chunked"),
                                                   ("connection", "close")]),
            h11.Data(data=b'{"error": '), h11.Data(data=b'"x"}'), h11.EndOfMessage(),
        ]

    with peer(tmp_path, chunked) as server:
        client = _wire(server)
        for _ in range(2):
            answer = client.request(b"GET", b"/a", b"")
            assert (answer.status_code, answer.content) == (503, b'{"error": "x"}')
        assert server.connections == 2  # `connection: close` is honoured


def test_r_srv_7_an_answer_cut_short_is_broken_and_nothing_is_sent_again(
    tmp_path: Path,
) -> None:
    """The request reached the service, whose answer stops half way: `Broken` (whether it acted
    is unknown), and the request is not written a second time."""
    seen: list[bytes] = []

    def cut(number: int, request: h11.Request, body: bytes) -> list[h11.Event] | None:
        seen.append(request.target)
        return None  # closed unanswered

    with peer(tmp_path, cut) as server:
        client = _wire(server)
        with pytest.raises(Broken):
            client.request(b"POST", b"/v1/reserve", b"{}")
        assert seen == [b"/v1/reserve"]


def test_r_srv_7_no_service_is_connect_failed(tmp_path: Path) -> None:
    client = Wire(unix_connector(str(tmp_path / "none.sock"), 1.0), 1.0, HEADERS)
    with pytest.raises(ConnectFailed):
        client.request(b"GET", b"/a", b"")


def test_r_srv_7_threads_sharing_a_client_never_share_a_connection(tmp_path: Path) -> None:
    with peer(tmp_path, echo) as server:
        client = _wire(server)
        wrong: list[bytes] = []

        def run(worker: int) -> None:
            for i in range(30):
                body = b"%d-%d" % (worker, i)
                got = client.request(b"POST", b"/x", body).content
                if got != b"POST /x " + body:
                    wrong.append(got)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert wrong == []
        assert server.connections <= 6


def test_r_srv_7_headers_and_targets_http_cannot_carry_are_refused_before_sending(
    tmp_path: Path,
) -> None:
    """A header value with a line break (a token pasted with its newline, say) or a target with
    a space would split the request: refused when the client is made or the request built."""
    connect = unix_connector(str(tmp_path / "none.sock"), 1.0)
    for bad in ((b"authorization", b"Bearer abc\r\nx-evil: 1"), (b"bad name", b"x"),
                (b"authorization", b"")):
        with pytest.raises(ValueError, match="cannot carry"):
            Wire(connect, 1.0, [*HEADERS, bad])
    client = Wire(connect, 1.0, HEADERS)
    for target in (b"/a b", b"a", b"/\xc3\xa9", b"/a\r\nx: y"):
        with pytest.raises(ValueError, match="cannot carry"):
            client.request(b"GET", target)


def test_r_srv_7_an_answer_in_many_small_writes_is_read_whole(tmp_path: Path) -> None:
    """The answer arrives a few bytes at a time (head and body split anywhere)."""
    body = b'{"id": 1, "source": "' + b"s" * 3000 + b'"}'

    class Trickle(Peer):
        def _answer(self, sock: socket.socket, number: int) -> None:
            conn = h11.Connection(h11.SERVER)
            while not isinstance(event := conn.next_event(), h11.EndOfMessage):
                if event is h11.NEED_DATA:
                    data = sock.recv(65536)
                    if not data:
                        return
                    conn.receive_data(data)
            whole = b"".join(conn.send(e) or b"" for e in ok(body))
            for at in range(0, len(whole), 7):
                sock.sendall(whole[at:at + 7])
            sock.recv(1)  # until the client closes

    server = Trickle(tmp_path / "t.sock", echo)
    try:
        client = _wire(server)
        answer = client.request(b"GET", b"/a")
        assert (answer.status_code, answer.content) == (200, body)
        client.close()
    finally:
        server.close()
