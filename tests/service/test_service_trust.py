"""The service's trust boundary (R-SRV-9, R-SRV-10, R-SRV-6, R-SRV-1; issue 29 items 1-4): the
page's session is its own value, never the token; metric labels come from fixed sets; strangers
on TCP cannot use up the socket's capacity; the HTTP layer's own errors are JSON and logged a
bounded number of times; HEAD answers like GET; the bearer scheme is case-insensitive.

One real `ledger serve --listen 127.0.0.1:0` subprocess for the module; raw sockets where the
bytes matter."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ledger.client import LedgerClient
from ledger.service.connections import (
    CONNECTION_LIMITS,
    LOG_BURST,
    UNAUTHENTICATED_DEADLINE_S,
    BoundedLog,
)
from ledger.service.sessions import PageSessions
from tests.support.ledgers import TEST_CATALOG
from tests.support.serving import Served, running

TOKEN = "trust-boundary-token-0123456789"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("trust") / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    (home / "recovery.json").write_text(json.dumps({"callsPerHour": 1_000_000}))
    with running(home, "--listen", "127.0.0.1:0", env={"LEDGER_TOKEN": TOKEN}) as service:
        yield service


def _address(served: Served) -> tuple[str, int]:
    assert served.url is not None
    host, port = served.url.removeprefix("http://").split(":")
    return host, int(port)


def _raw_tcp(served: Served, data: bytes) -> bytes:
    """Send `data` on a new TCP connection; everything the service sent until it closed."""
    with socket.create_connection(_address(served), timeout=60) as sock:
        sock.sendall(data)
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                return answer
            if not chunk:
                return answer
            answer += chunk


def _json_error(answer: bytes, status: int) -> dict[str, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]
    assert b"content-type: application/json" in head.lower()
    doc = json.loads(body)
    assert set(doc) == {"error"}
    assert {"code", "message"} <= set(doc["error"])
    error: dict[str, str] = doc["error"]
    return error


# item 4: the page's session (R-SRV-10) ------------------------------------------------------


def test_r_srv_10_sign_in_sets_a_random_session_never_the_token(served: Served) -> None:
    """Before: the cookie was `ledger_page=<token>`, and that cookie opened the page."""
    assert served.url is not None
    values = []
    for _ in range(2):
        signed = httpx.get(served.url + "/", params={"token": TOKEN})
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"]
        assert TOKEN not in cookie
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert "Max-Age=" in cookie
        values.append(signed.cookies["ledger_page"])
    assert values[0] != values[1]
    assert len(values[0]) >= 32
    session = {"ledger_page": values[0]}
    assert httpx.get(served.url + "/", cookies=session).status_code == 200
    assert httpx.head(served.url + "/", cookies=session).status_code == 200
    # the session opens the page only, never the API (as a cookie or as a bearer value)
    assert httpx.get(served.url + "/v1/status", cookies=session).status_code == 401
    bearer = {"authorization": f"Bearer {values[0]}"}
    assert httpx.get(served.url + "/v1/status", headers=bearer).status_code == 401
    # a cookie holding the token (what a local dev server could have been handed) opens nothing
    assert httpx.get(served.url + "/", cookies={"ledger_page": TOKEN}).status_code == 401
    assert httpx.get(served.url + "/", cookies={"ledger_page": "made-up"}).status_code == 401


def test_r_srv_10_unauthenticated_page_says_how_to_sign_in(served: Served) -> None:
    """Before: raw JSON `unauthorized` at `/` in a browser."""
    assert served.url is not None
    answer = httpx.get(served.url + "/")
    assert answer.status_code == 401
    assert answer.headers["content-type"].startswith("text/html")
    assert "/?token=" in answer.text
    assert "LEDGER_TOKEN" in answer.text  # where the token is (here: the variable)
    assert TOKEN not in answer.text


def test_r_srv_10_the_sign_in_page_names_the_token_file(home: Path) -> None:
    with running(home, "--listen", "127.0.0.1:0") as service:
        assert service.url is not None
        assert service.token is not None
        answer = httpx.get(service.url + "/")
        assert answer.status_code == 401
        assert str(home / "ledger.token") in answer.text
        assert service.token not in answer.text


# item 1: fixed metric labels (R-SRV-9) ------------------------------------------------------


def _metrics(served: Served) -> str:
    with served.client() as http:
        answer = http.get("/metrics")
        assert answer.status_code == 200
        return answer.text


def test_r_srv_9_made_up_methods_never_grow_metrics(served: Served) -> None:
    """Before: 300 made-up 2 KB methods without a token grew /metrics from 4 KB to 10 MB. A
    method the HTTP parser does not know is 400 `bad_request` at the HTTP layer (a bad request
    is a 4xx); a registered one outside the API reaches it and is the label `other`."""
    _metrics(served)
    before = len(_metrics(served))
    for i in range(60):
        method = f"M{i:04d}".encode() + b"X" * 2000
        request = method + b" /v1/nowhere-%d HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n" % i
        error = _json_error(_raw_tcp(served, request), 400)
        assert error["code"] == "bad_request"
    known = b"PURGE /v1/nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    assert _raw_tcp(served, known).startswith(b"HTTP/1.1 401")  # without a token: refused
    with served.client() as http:  # on the socket too: an unknown method on an unknown path
        for i in range(20):
            assert http.request(f"BREW{i}", f"/made/up/{i}").status_code == 400
        for registered in ("PURGE", "PROPFIND", "MKCOL"):
            assert http.request(registered, "/made/up/x").status_code in (404, 405)
    text = _metrics(served)
    assert len(text) - before < 4000, len(text) - before
    assert "M0001X" not in text
    assert "BREW1" not in text
    assert "/made/up" not in text
    assert 'method="other"' in text
    assert 'route="unauthenticated"' in text


# item 2: strangers never use up the socket's capacity (R-SRV-9) -----------------------------


@pytest.mark.slow
def test_r_srv_9_idle_strangers_on_tcp_never_lock_out_the_socket(served: Served) -> None:
    """Before: 999 idle TCP connections made a reserve on the unix socket answer 503."""
    idle = []
    try:
        for _ in range(999):
            try:
                idle.append(socket.create_connection(_address(served), timeout=10))
            except OSError:
                break  # past the strangers' limit the service may close at once
        time.sleep(1.0)  # the service has accepted (and over its limit, closed) them
        with LedgerClient(served.socket) as client:
            reservation = client.reserve("socket-client", "alpha/small")
            assert reservation.id > 0
        # an idle stranger is cut after its short deadline (well before the 10 s header one)
        first = idle[0]
        first.settimeout(30)
        started = time.monotonic()
        data = b""
        try:
            while chunk := first.recv(65536):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        assert time.monotonic() - started < 9.5
        if data:
            assert _json_error(data, 408)["code"] == "request_timeout"
    finally:
        for sock in idle:
            sock.close()
    assert CONNECTION_LIMITS["unauthenticated"] < CONNECTION_LIMITS["unix"]


# item 3: the HTTP layer's own errors, HEAD, the bearer scheme (R-SRV-6, R-SRV-9) -------------

BAD_REQUESTS = {
    "negative-length": b"POST /v1/reserve HTTP/1.1\r\nhost: x\r\ncontent-length: -5\r\n\r\n",
    "non-numeric-length": b"POST /v1/reserve HTTP/1.1\r\nhost: x\r\ncontent-length: 1e3\r\n\r\n",
    "conflicting-lengths": (
        b"POST /v1/reserve HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n"
    ),
    "bad-chunk-size": (
        b"POST /v1/reserve HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
    ),
    "tls-hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)) + b"\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(BAD_REQUESTS))
def test_r_srv_9_http_layer_errors_get_the_json_shape(served: Served, name: str) -> None:
    """Before: uvicorn's `400 text/plain "Invalid HTTP request received."`."""
    error = _json_error(_raw_tcp(served, BAD_REQUESTS[name]), 400)
    assert error["code"] == "bad_request"


@pytest.mark.parametrize("size", [20 * 1024, 400 * 1024], ids=["20k", "400k"])
def test_r_srv_9_a_head_over_16_kib_is_refused_even_in_one_read(served: Served, size: int) -> None:
    """Before: up to ~256 KiB were accepted when they arrived in one read (400 KB: text/plain)."""
    request = (
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + TOKEN.encode()
        + b"\r\nx-padding: " + b"p" * size + b"\r\n\r\n"
    )
    assert _json_error(_raw_tcp(served, request), 431)["code"] == "headers_too_large"


def _head(measure: int) -> bytes:
    """A request whose head measures `measure` bytes (method, target, and each header's name
    and value plus 4: the measure the 16 KiB limit is on)."""
    base = b"GET /healthz HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + TOKEN.encode() + b"\r\n"
    used = len("GET") + len("/healthz") + len("host") + 1 + 4
    used += len("authorization") + len("Bearer ") + len(TOKEN) + 4
    used += len("x-padding") + 4
    request = base + b"x-padding: " + b"p" * (measure - used) + b"\r\n\r\n"
    return request


def _in_writes(served: Served, request: bytes, size: int) -> bytes:
    """`request` sent in writes of `size` bytes, a pause after each; what the service sent."""
    with socket.create_connection(_address(served), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for at in range(0, len(request), size):
            try:
                sock.sendall(request[at:at + size])
            except (BrokenPipeError, ConnectionResetError):
                break  # answered and closed before the head ended
            time.sleep(0.001)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize("writes", [0, 100, 7], ids=["one-write", "100-byte", "7-byte"])
def test_r_srv_9_a_head_of_exactly_16_kib_passes_one_byte_more_is_431(
    served: Served, writes: int
) -> None:
    """The limit is the same however the head arrives: in one write (the parser sees it whole)
    or in many small ones (the service counts it as it comes)."""
    at_limit, over = _head(16 * 1024), _head(16 * 1024 + 1)
    if writes:
        passed, refused = _in_writes(served, at_limit, writes), _in_writes(served, over, writes)
    else:
        passed, refused = _raw_tcp(served, at_limit), _raw_tcp(served, over)
    assert passed.startswith(b"HTTP/1.1 200 "), passed[:200]
    assert _json_error(refused, 431)["code"] == "headers_too_large"


def test_r_srv_9_one_endless_header_value_is_cut_at_16_kib(served: Served) -> None:
    """A header value that never ends (sent 1000 bytes a write) is refused once it passes the
    limit, not held until the header deadline: the parser keeps a header until it is whole."""
    value = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-endless: " + b"v" * (200 * 1024)
    started = time.monotonic()
    answer = _in_writes(served, value, 1000)
    assert _json_error(answer, 431)["code"] == "headers_too_large"
    assert time.monotonic() - started < 5


HTTP_LAYER_ANSWERS = {
    "gzip-coding": (
        b"POST /v1/reserve HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n",
        501, "not_implemented",
    ),
    "gzip-then-chunked": (
        b"POST /v1/reserve HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
        b"0\r\n\r\n",
        501, "not_implemented",
    ),
    "connect": (
        b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
        400, "bad_request",
    ),
    "no-host": (b"GET /healthz HTTP/1.1\r\nconnection: close\r\n\r\n", 400, "bad_request"),
    "two-hosts": (b"GET /healthz HTTP/1.1\r\nhost: x\r\nhost: y\r\n\r\n", 400, "bad_request"),
    "http-0.9": (b"GET /healthz\r\n\r\n", 400, "bad_request"),
    "http-2.0": (b"GET /healthz HTTP/2.0\r\nhost: x\r\n\r\n", 400, "bad_request"),
}


@pytest.mark.parametrize("name", sorted(HTTP_LAYER_ANSWERS))
def test_r_srv_9_unsupported_codings_methods_and_versions_are_json(
    served: Served, name: str
) -> None:
    request, status, code = HTTP_LAYER_ANSWERS[name]
    assert _json_error(_raw_tcp(served, request), status)["code"] == code


def test_r_srv_9_a_bad_request_after_a_pipelined_one_is_answered_after_it(served: Served) -> None:
    """Requests read before a malformed one are answered first, in order; then its 400."""
    good = b"GET /healthz HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + TOKEN.encode()
    answer = _raw_tcp(served, good + b"\r\n\r\n" + good + b"\r\n\r\n\x16\x03\x01junk\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 ") == 2, answer
    last = answer[answer.rindex(b"HTTP/1.1 "):]
    assert _json_error(last, 400)["code"] == "bad_request"


def test_r_srv_9_a_stream_of_bad_requests_writes_a_bounded_log(served: Served) -> None:
    """Before: one log line per bad request."""
    time.sleep(0.5)
    lines_before = len(served.log)
    for _ in range(4 * LOG_BURST + 10):
        _raw_tcp(served, BAD_REQUESTS["tls-hello"])
    time.sleep(0.5)
    assert len(served.log) - lines_before <= LOG_BURST + 1, served.log[lines_before:]
    _still_serving(served)


def _still_serving(served: Served) -> None:
    with served.client() as http:
        assert http.post("/v1/select", json={"source": "fine"}).status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/"])
def test_r_srv_4_head_answers_like_get_without_a_body(served: Served, path: str) -> None:
    """Before: 405 (health checkers send HEAD)."""
    with served.client() as http:
        got = http.get(path)
        head = http.head(path)
    assert head.status_code == got.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_r_srv_1_the_bearer_scheme_is_case_insensitive(served: Served, scheme: str) -> None:
    """Before: a lowercase `bearer` was refused (RFC 7235: the scheme is case-insensitive)."""
    assert served.url is not None
    answer = httpx.get(served.url + "/v1/status", headers={"authorization": f"{scheme} {TOKEN}"})
    assert answer.status_code == 200
    wrong = httpx.get(served.url + "/v1/status", headers={"authorization": f"{scheme} x{TOKEN}"})
    assert wrong.status_code == 401


# the bounds themselves, with a clock handed in ----------------------------------------------


def test_r_srv_10_sessions_expire_and_at_most_the_limit_are_kept() -> None:
    now = [1000.0]
    sessions = PageSessions(lifetime_s=60, limit=3, clock=lambda: now[0])
    first = sessions.new()
    assert sessions.valid(first)
    assert b"Max-Age=60" in sessions.cookie(first)
    now[0] += 61
    assert not sessions.valid(first)  # ended
    kept = [sessions.new() for _ in range(5)]
    assert len(sessions) == 3  # the oldest went first
    assert [sessions.valid(v) for v in kept] == [False, False, True, True, True]
    assert not sessions.valid(None)
    assert not sessions.valid(b"")


def test_r_srv_9_the_http_log_is_bounded_and_counts_what_it_left_out() -> None:
    now = [0.0]
    bound = BoundedLog(window_s=60, burst=3, clock=lambda: now[0])
    log = logging.getLogger("tests.bounded")
    records = [log.makeRecord("x", logging.WARNING, "f", 1, "bad request", (), None)
               for _ in range(10)]
    assert [bound.filter(r) for r in records] == [True] * 3 + [False] * 7
    now[0] += 61
    later = log.makeRecord("x", logging.WARNING, "f", 1, "bad request", (), None)
    assert bound.filter(later)
    assert later.getMessage() == "bad request (7 similar lines left out before)"


def test_r_srv_9_a_forwarded_for_header_never_moves_the_client_address(served: Served) -> None:
    """Before: uvicorn's proxy-header middleware (on by default, trusting 127.0.0.1) took the
    client address from `X-Forwarded-For`, so the gate told the pools of a client they did not
    know: the connection stayed a stranger and was cut at the strangers' deadline although it
    had shown the token, mid-session. The service sits behind no proxy: the peer's own address
    is the client."""
    assert served.url is not None
    headers = {"authorization": f"Bearer {TOKEN}", "x-forwarded-for": "203.0.113.9"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=30) as client:
        first = client.get("/v1/status")
        assert first.status_code == 200
        stream = first.extensions["network_stream"]
        until = time.monotonic() + UNAUTHENTICATED_DEADLINE_S + 1.0  # past the deadline
        while time.monotonic() < until:  # busy: never idle as long as the keep-alive timeout
            time.sleep(0.5)
            answer = client.get("/v1/status")
            assert answer.status_code == 200
            # the same keep-alive connection answered every time: it left the strangers'
            # pool when it showed the token
            assert answer.extensions["network_stream"] is stream
