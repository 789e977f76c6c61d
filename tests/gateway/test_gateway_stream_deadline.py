"""R-GW-5b through a real `ledger serve` and the stand-in: a stream still being relayed when its
reservation's deadline comes is ended with the format's error event (code `deadline`), its
upstream request closed and its reservation settled `cancelled` (not `late`, not a failure: no
strike, no cooldown) with the usage seen so far; and its in-flight slot is never free in the
store while the exchange is open. The slow party is the caller (a reader that takes its bytes
slowly: the writes to it are under the deadline too) or the upstream."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from ledger.status.document import build_status
from tests.support.gateway_keys import _new_key
from tests.support.gateway_setup import gateway

TIMEOUT_MS = 3000
WAIT_S = 120.0  # generous: a loaded 2-core machine
ROW = ("SELECT status, late, kind, follow_up, input_tokens, output_tokens, cache_write_tokens,"
       " cache_read_tokens, subkind, cost_micro = estimate_micro, settled_ms < deadline_ms"
       " FROM reservations")  # fmt: skip


def _policy(idle_ms: int) -> dict[str, Any]:
    return {
        "timeoutMs": TIMEOUT_MS,
        "gateway": {"firstTokenMs": 2000, "idleMs": idle_ms},
        "scopes": {"slots": {"inFlight": 1}},
    }


def _request(host: str, key: str) -> bytes:
    body = json.dumps({"model": "acme/a1", "stream": True,
                       "messages": [{"role": "user", "content": "x"}]}).encode()  # fmt: skip
    head = (f"POST /openai/v1/chat/completions HTTP/1.0\r\nhost: {host}\r\n"
            f"authorization: Bearer {key}\r\nx-ledger-source: slow-reader\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


def _in_flight(led: Ledger) -> int:
    scopes = {s["name"]: s for s in build_status(led)["scopes"]}
    return int(scopes["slots"]["in_flight"]["open"])


def _statuses(led: Ledger) -> list[str]:
    with led.db.engine.connect() as conn:
        return [str(r[0]) for r in conn.exec_driver_sql("SELECT status FROM reservations")]


def _row(led: Ledger) -> tuple[object, ...]:
    with led.db.engine.connect() as conn:
        rows = conn.exec_driver_sql(ROW).all()
    assert len(rows) == 1  # nothing followed it: no retry, no fallback
    return tuple(rows[0])


def _no_strike(led: Ledger) -> None:
    for health in build_status(led)["health"]:
        assert (health["state"], health["consecutive_failures"]) == ("healthy", 0), health


def _wait_closed(standin: StandIn) -> None:
    end = time.monotonic() + WAIT_S
    while standin.closed_early == 0:
        assert time.monotonic() < end, "the upstream request was never closed"
        time.sleep(0.05)


def _dechunked(head: bytes, body: bytes) -> bytes:
    """The body of a chunked answer without its framing (a stream that closes its connection
    is still chunked, so a cut one is told from a whole one); any other body as it is."""
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    out, rest = bytearray(), body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return bytes(out)


def _last_event(body: bytes) -> tuple[str | None, dict[str, Any]]:
    """The last event of an SSE body: its `event:` name and parsed data."""
    last = [e for e in body.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()][-1]
    name, data = None, ""
    for line in last.decode().split("\n"):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
    return name, json.loads(data)


def test_r_gw_5b_a_slow_reader_is_ended_at_the_deadline_and_its_slot_held_until(
    home: Path,
) -> None:
    # 24 MB the caller reads a few KB at a time: the relay waits on the writes to the caller,
    # not on upstream, when the deadline comes
    big = Scripted(text="y" * 24_000_000, stream_pieces=2400)
    with StandIn({"a1": [big]}) as standin, gateway(home, standin, **_policy(10_000)) as gw:
        key = _new_key(home, "reader")
        led = Ledger.open(home)
        address = urlsplit(gw.url)
        assert address.hostname is not None
        assert address.port is not None
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(WAIT_S)
            sock.connect((address.hostname, address.port))
            sock.sendall(_request(address.netloc, key))
            received = bytearray(sock.recv(4096))  # the head comes once the stream began
            checked = 0
            end = time.monotonic() + WAIT_S
            while True:
                in_flight = _in_flight(led)  # read before the status: see below
                if _statuses(led) != ["open"]:
                    break
                # still open in the store after `in_flight` was read, so open then too: its
                # slot must have counted (R-SC-1), which it does only before its deadline
                assert in_flight == 1
                checked += 1
                assert time.monotonic() < end, "never settled"
                received += sock.recv(4096)
                time.sleep(0.05)  # the slow reader: a few KB at a time
            while chunk := sock.recv(1 << 16):  # then it reads the rest at once
                received += chunk
        _wait_closed(standin)
        assert checked > 0
        assert _in_flight(led) == 0  # settled: the slot is free
        head, _, body = bytes(received).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        body = _dechunked(head, body)
        assert b'"content":"yyy' in body  # the caller had content before the end
        name, error = _last_event(body)
        assert name is None
        assert error["error"]["code"] == "deadline"
        assert b"[DONE]" not in body
        # cancelled before its deadline (so not late), nothing seen of the usage (OpenAI sends it
        # last): the estimate, marked; no failure, so no follow-up and no strike
        assert _row(led) == ("cancelled", False, "cancelled", None, None, None, None, None,
                             "usage_estimated", True, True)  # fmt: skip
        _no_strike(led)
        assert len(standin.requests) == 1


def test_r_gw_5b_a_slow_upstream_is_ended_at_the_deadline_with_the_usage_seen(
    home: Path,
) -> None:
    # events every 0.2 s (never idle for idleMs) for 20 s: the deadline ends it, cancelled with
    # message_start's input and cache tokens recorded, not a stall and not a strike
    slow = Scripted(text="z" * 100, stream_pieces=100, event_delay_s=0.2, input_tokens=7,
                    cache_write_tokens=11, cache_read_tokens=13)  # fmt: skip
    with StandIn({"b1": [slow]}) as standin, gateway(home, standin, **_policy(1000)) as gw:
        led = Ledger.open(home)
        with httpx.stream("POST", gw.url + "/anthropic/v1/messages", timeout=WAIT_S,
                          headers={"x-api-key": gw.token},
                          json={"model": "bolt/b1", "max_tokens": 50, "stream": True,
                                "messages": [{"role": "user", "content": "x"}]}) as answer:
            assert answer.status_code == 200
            body = answer.read()
        _wait_closed(standin)
        name, error = _last_event(body)
        assert name == "error"
        assert error["type"] == "error"
        assert error["error"]["code"] == "deadline"
        assert b"content_block_delta" in body
        assert b"message_stop" not in body
        assert _row(led) == ("cancelled", False, "cancelled", None, 7, None, 11, 13,
                             "usage_estimated", True, True)  # fmt: skip
        _no_strike(led)
        assert len(standin.requests) == 1
