"""A local provider stand-in on 127.0.0.1 for tests and `ledger demo` (SPEC section 14).

Speaks the OpenAI-compatible chat-completions wire format (`POST /v1/chat/completions`, base URL
`http://127.0.0.1:PORT/v1`) and the Anthropic messages format (`POST /v1/messages`, base URL
`http://127.0.0.1:PORT`), replying per model id from a script.

It is as strict as the real APIs about what it accepts (issue 13 item 4; `ledger.standin.formats`):
a request the real API would reject gets the real API's error status and error type, and every
reply has the shape the official SDKs parse. The OpenAI path, like local OpenAI-compatible
servers, accepts a request without a key; the Anthropic path requires `x-api-key`.

Invariant: it never records a credential value (only whether one was sent), and stopping it is
prompt: every handler waits on the stop event, so a delayed or trickling reply ends at shutdown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple

from ledger.standin import extra, ratelimits, responses
from ledger.standin.formats import (
    StreamEvent,
    anthropic_stream,
    anthropic_success,
    error_json,
    openai_stream,
    openai_success,
    request_problem,
)

SECRET_HEADERS = frozenset({"authorization", "x-api-key", "proxy-authorization", "cookie"})
REDACTED = "<redacted>"
MAX_REQUEST_BYTES = 16 * 1024 * 1024

_OPENAI_PATH = "/v1/chat/completions"
_ANTHROPIC_PATH = "/v1/messages"


@dataclass(frozen=True)
class Scripted:
    """One scripted reply."""

    status: int = 200
    retry_after: str | None = None
    error_code: str | None = None
    text: str = '{"ok": true}'
    stop_reason: str | None = None
    delay_s: float = 0.0
    trickle_body: bool = False
    input_tokens: int = 10
    """Uncached prompt tokens (OpenAI's `prompt_tokens` adds the cached ones to them)."""
    output_tokens: int = 5
    cache_write_tokens: int = 0
    """Prompt tokens written to the cache (Anthropic: `cache_creation_input_tokens`)."""
    cache_read_tokens: int = 0
    """Prompt tokens read from the cache (Anthropic: `cache_read_input_tokens`; OpenAI:
    `prompt_tokens_details.cached_tokens`)."""
    cost_usd: float | None = None
    """Sent as OpenRouter-style `usage.cost` on OpenAI-format successes."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra response headers (e.g. rate-limit reset metadata)."""
    error_body_bytes: int | None = None
    """Pad the error body to about this many bytes."""
    trickle_interval_s: float = 0.05
    """Seconds between trickled bytes (a long interval is a stalled body)."""
    raw_body: bytes | None = None
    """Send exactly these bytes as the body (e.g. invalid JSON on a 200)."""
    cut_body: bool = False
    """Promise a longer body than is sent, then close: a stream cut."""
    error_message: str | None = None
    """The error body's `message` text (default `scripted error`), e.g. a marker for leak tests."""
    error_detail_code: str | None = None
    """Anthropic `error.details.error_code` (e.g. `enforced_spend_limit_reached` on a 429)."""
    # ---- streams (a request with `stream: true`) and connection faults
    reset: bool = False
    """Close the connection before any status line: a TCP reset before headers."""
    stream_pieces: int = 3
    """Content events the text is split into."""
    first_event_delay_s: float = 0.0
    """Seconds after the headers before the first event (a slow first token)."""
    event_delay_s: float = 0.0
    """Seconds between events."""
    cut_after: int | None = None
    """Close the stream after this many content events (no finish reason): a cut."""
    stall_after: int | None = None
    """Stop sending after this many content events and keep the connection open: a stall."""
    malformed_after: int | None = None
    """Send a malformed event after this many content events."""
    no_terminator: bool = False
    """End the stream after its finish reason (and usage) without `[DONE]` / `message_stop`."""
    no_usage: bool = False
    """Leave usage out of the stream."""
    error_event_after: int | None = None
    """Send the format's error event (`overloaded_error`) after this many content events, then
    close the stream."""
    transport_error_after: int | None = None
    """Promise a longer body (Content-Length) and close after this many content events: an
    incomplete body, a transport error at the reader (where `cut_after` is a clean end)."""
    big_event_mib: int | None = None
    """Before the first content event, one well-formed event (no content) whose `data` spans
    this many 1 MiB `data:` lines, with no blank line between them (R-GW-5a)."""
    tool_call: tuple[str, str] | None = None
    """Answer with a call of this tool: (name, JSON arguments) (non-streaming replies; the
    Responses path streams it too)."""
    # ---- rate-limit headers (R-TOK-4): what is left of the account's token limit
    tokens_remaining: int | None = None
    """Report exactly this many tokens left (OpenAI `x-ratelimit-remaining-tokens`, Anthropic
    `anthropic-ratelimit-tokens-remaining`), on any status; None: the stand-in's own meter on
    successes (`StandIn(tokens_per_minute=...)`)."""
    tokens_reset_s: float = 60.0
    """With `tokens_remaining`: when the limit resets, in seconds (`20s`, or an RFC 3339 time)."""


def _cache(reply: Scripted) -> tuple[int, int]:
    return reply.cache_write_tokens, reply.cache_read_tokens


class Metered(NamedTuple):
    """One answer the enforcing meter decided (`StandIn(enforce_tokens=True)`): the request's
    body, whether it was answered (False: a 429), the tokens left after it, when that window
    resets and when it was decided (wall-clock seconds)."""

    body: Any
    answered: bool
    left: int
    reset_at_s: float
    at_s: float


class ReceivedRequest(NamedTuple):
    """One request the stand-in received; secret header values are replaced by REDACTED."""

    path: str
    model: str | None
    headers: Mapping[str, str]


class StandIn:
    """A scripted provider server in a background thread; use as a context manager."""

    def __init__(
        self,
        script: Mapping[str, Sequence[Scripted]] | None = None,
        default: Scripted | None = None,
        *,
        port: int = 0,
        keep_alive: bool = False,
        tokens_per_minute: int | None = ratelimits.DEFAULT_TOKENS_PER_MINUTE,
        enforce_tokens: bool = False,
        token_window_s: float = 60.0,
    ) -> None:
        self.default = default or Scripted()
        # the token limit its successes report (R-TOK-4); None: no rate-limit headers
        self.meter = (None if tokens_per_minute is None
                      else ratelimits.TokenMeter(tokens_per_minute, token_window_s))  # fmt: skip
        # answer 429 instead of a success that does not fit what is left of the window
        self.enforce_tokens = enforce_tokens and self.meter is not None
        self._metered: list[Metered] = []
        # HTTP/1.1 keep-alive for fault-free replies (a real provider's connections are reused);
        # off by default: every reply closes its connection, as the fault tests expect
        self.keep_alive = keep_alive
        self._connections: set[socket.socket] = set()
        self._connected = 0
        self._script: dict[str, list[Scripted]] = {
            model: list(replies) for model, replies in (script or {}).items()
        }
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed_early = 0
        self._open = 0
        self._most_open = 0
        self._requests: list[ReceivedRequest] = []
        self._bodies: list[Any] = []
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> StandIn:
        """Bind 127.0.0.1 and serve in a background thread."""
        if self._server is not None:
            return self
        self._stop.clear()
        server = _Server(("127.0.0.1", self._port), _Handler)
        server.standin = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="ledger-standin",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; delayed and trickling replies end promptly."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stop.set()
        with self._lock:  # idle keep-alive connections: their handlers end now
            idle = list(self._connections)
        for sock in idle:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        server.shutdown()
        server.server_close()  # joins handler threads, which all watch the stop event
        if thread is not None:
            thread.join()
        self._server = self._thread = None

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---------------------------------------------------------------- addresses

    @property
    def port(self) -> int:
        """The bound port."""
        if self._server is None:
            raise RuntimeError("the stand-in is not running")
        return int(self._server.server_address[1])

    @property
    def base_url_openai(self) -> str:
        """Base URL for an `openai-chat` provider."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def base_url_anthropic(self) -> str:
        """Base URL for an `anthropic-messages` provider."""
        return f"http://127.0.0.1:{self.port}"

    # ---------------------------------------------------------------- script and records

    def set_script(self, model_id: str, replies: Iterable[Scripted]) -> None:
        """Replace the replies queued for a model while running."""
        with self._lock:
            self._script[model_id] = list(replies)

    def next_reply(self, model_id: str | None) -> Scripted:
        """Pop the model's next scripted reply, or the default when none is left."""
        with self._lock:
            queue = self._script.get(model_id or "")
            return queue.pop(0) if queue else self.default

    @property
    def requests(self) -> list[ReceivedRequest]:
        """A copy of the requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def bodies(self) -> list[Any]:
        """The parsed JSON request bodies, aligned with `requests` (test use only)."""
        with self._lock:
            return list(self._bodies)

    @property
    def metered(self) -> list[Metered]:
        """The enforcing meter's decisions so far, in the order taken (test use only)."""
        with self._lock:
            return list(self._metered)

    def meter_reply(self, reply: Scripted, model: str, body: Any) -> Scripted:
        """Enforcing: `reply` with what is left of the window after it, or a 429 saying what is
        left when its tokens do not fit (any other reply is sent as scripted)."""
        meter = self.meter
        if not self.enforce_tokens or meter is None or reply.status >= 300:
            return reply
        if reply.tokens_remaining is not None:
            return reply
        tokens = (reply.input_tokens + reply.cache_write_tokens + reply.cache_read_tokens
                  + reply.output_tokens)  # fmt: skip
        now = time.time()
        answered, left, reset_s = meter.take(model, tokens, now)
        with self._lock:
            self._metered.append(Metered(body, answered, left, now + reset_s, now))
        if answered:
            return dataclasses.replace(reply, tokens_remaining=left, tokens_reset_s=reset_s)
        return Scripted(status=429, error_code="rate_limit_exceeded", tokens_remaining=left,
                        tokens_reset_s=reset_s, retry_after=str(max(1, math.ceil(reset_s))))

    def record(self, request: ReceivedRequest, body: Any) -> None:
        """Remember one received request."""
        with self._lock:
            self._requests.append(request)
            self._bodies.append(body)

    @property
    def connections(self) -> int:
        """TCP connections accepted so far (keep-alive reuses them)."""
        with self._lock:
            return self._connected

    def connected(self, sock: socket.socket, live: bool) -> None:
        """A handler's connection opened (`live`) or ended."""
        with self._lock:
            if live:
                self._connected += 1
                self._connections.add(sock)
            else:
                self._connections.discard(sock)

    @property
    def closed_early(self) -> int:
        """Replies the client closed before they were complete (R-GW-7 checks it)."""
        with self._lock:
            return self._closed_early

    def note_closed_early(self) -> None:
        """A client closed a reply before its end."""
        with self._lock:
            self._closed_early += 1

    def opened(self) -> Callable[[], None]:
        """Count one request as being answered now; returns its close (idempotent).

        `most_open` is the most requests answered at once (R-SC-1's `inFlight` test reads it).
        A stream closes just before its last event is written, so a caller that settles on that
        event never sees its slot counted here after it settled."""
        with self._lock:
            self._open += 1
            self._most_open = max(self._most_open, self._open)
        closed = False

        def close() -> None:
            nonlocal closed
            with self._lock:
                if not closed:
                    closed = True
                    self._open -= 1

        return close

    @property
    def open_now(self) -> int:
        """Requests being answered now."""
        with self._lock:
            return self._open

    @property
    def most_open(self) -> int:
        """The most requests answered at once so far."""
        with self._lock:
            return self._most_open

    @property
    def stopping(self) -> threading.Event:
        """Set when the stand-in is shutting down."""
        return self._stop


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins handlers; they end promptly at stop
    block_on_close = True
    # Every reply closes its connection (HTTP/1.0), so concurrent callers arrive as a burst of
    # new connections; socketserver's backlog of 5 dropped the SYNs past it and the kernel
    # retried them a second later: the 1 s tail of the gateway figure (issue 31), which was
    # the stand-in's, not the gateway's. A real provider's listener holds a burst.
    request_queue_size = 1024
    standin: StandIn

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Client disconnects are part of the scripts; stay quiet."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    _close_open: Callable[[], None]
    protocol_version = "HTTP/1.0"
    timeout = 10  # a stuck client cannot hold a handler thread forever

    _keep = False  # this reply keeps its connection open (HTTP/1.1, fault-free replies only)
    _responses = False  # the path is the Responses API's (ledger.standin.responses)

    def setup(self) -> None:
        """Count the connection; speak HTTP/1.1 when the stand-in keeps connections alive."""
        super().setup()
        if self.server.standin.keep_alive:
            self.protocol_version = "HTTP/1.1"
            # as a real server does: a small write (a stream's chunk) goes out at once, not after
            # the client's delayed ACK of the one before (40 ms on a reused connection)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.standin.connected(self.connection, True)

    def finish(self) -> None:
        self.server.standin.connected(self.connection, False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: requests carry caller text."""

    def do_POST(self) -> None:
        """Serve one scripted reply in the wire format of the path (counted while open)."""
        self._close_open = self.server.standin.opened()
        self._keep = False
        self.close_connection = True  # a reply that keeps it says so
        try:
            self._answer()
        finally:
            self._close_open()

    def _answer(self) -> None:
        standin = self.server.standin
        path = self.path.split("?", 1)[0]
        if path in extra.PATHS:  # embeddings and count_tokens (R-FMT-5)
            self._extra(path)
            return
        self._responses = path == responses.PATH
        if path not in (_OPENAI_PATH, _ANTHROPIC_PATH, responses.PATH):
            self._send(404, {"error": {"type": "not_found_error", "code": "not_found"}})
            return
        anthropic = path == _ANTHROPIC_PATH
        body = self._read_json()
        model = body.get("model") if isinstance(body, dict) else None
        model = model if isinstance(model, str) else None
        headers = {
            name.lower(): REDACTED if name.lower() in SECRET_HEADERS else value
            for name, value in self.headers.items()
        }
        standin.record(ReceivedRequest(path, model, headers), body)
        refusal = (responses.request_problem(body) if self._responses
                   else request_problem(anthropic, headers, body))  # fmt: skip
        if refusal is not None or model is None:
            status, code = refusal or (400, None)
            self._send(status, error_json(anthropic, status, code, message="rejected request"))
            return
        reply = standin.meter_reply(standin.next_reply(model), model, body)
        self._keep = standin.keep_alive and _fault_free(reply)
        if reply.delay_s > 0 and standin.stopping.wait(reply.delay_s):
            return
        if reply.reset:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)
            return
        if isinstance(body, dict) and body.get("stream") is True and reply.status < 300:
            try:
                self._stream(reply, anthropic, model)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                standin.note_closed_early()
            return
        # The client may give up (its deadline, a bounded error read): that is expected.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
            self._reply(reply, anthropic, model)

    def _extra(self, path: str) -> None:
        standin = self.server.standin
        body = self._read_json()
        model = body.get("model") if isinstance(body, dict) else None
        model = model if isinstance(model, str) else None
        headers = {
            name.lower(): REDACTED if name.lower() in SECRET_HEADERS else value
            for name, value in self.headers.items()
        }
        standin.record(ReceivedRequest(path, model, headers), body)
        reply = standin.next_reply(model)
        status, document = extra.answer(path, headers, body, reply.status, reply.input_tokens)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
            self._send(status, document)

    def _read_json(self) -> Any:
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            return None
        if not 0 <= length <= MAX_REQUEST_BYTES:
            return None
        try:
            return json.loads(self.rfile.read(length))
        except (ValueError, RecursionError):
            return None

    def _limits(self, reply: Scripted, anthropic: bool, model: str) -> list[tuple[str, str]]:
        """The rate-limit headers of this answer (R-TOK-4): the scripted remainder on any
        status, else the meter's on a success."""
        now = time.time()
        if reply.tokens_remaining is not None:
            left = {"tokens": reply.tokens_remaining}
            return ratelimits.headers(anthropic, left, reply.tokens_reset_s, now)
        meter = self.server.standin.meter
        if meter is None or reply.status >= 300:
            return []
        input_tokens = reply.input_tokens + reply.cache_write_tokens + reply.cache_read_tokens
        left, reset = meter.spend(model, input_tokens, reply.output_tokens, now)
        if not anthropic:
            left = {"tokens": left["tokens"]}
        return ratelimits.headers(anthropic, left, reset, now, meter.limit)

    def _reply(self, reply: Scripted, anthropic: bool, model: str) -> None:
        extra = [*reply.headers, *self._limits(reply, anthropic, model)]
        if reply.retry_after is not None:
            extra.append(("Retry-After", reply.retry_after))
        if reply.raw_body is not None:
            self._send_bytes(reply.status, reply.raw_body, extra)
        elif reply.trickle_body:
            self._trickle(reply, extra)
        elif reply.status >= 300:
            document = error_json(
                anthropic,
                reply.status,
                reply.error_code,
                pad_to=reply.error_body_bytes,
                message=reply.error_message,
                detail_code=reply.error_detail_code,
            )
            self._send(reply.status, document, extra)
        elif self._responses:
            document = responses.success(model, responses.new_id(), reply.text, reply.stop_reason,
                                         reply.input_tokens, reply.output_tokens,
                                         cache=_cache(reply),
                                         tool_call=reply.tool_call)  # fmt: skip
            self._send(reply.status, document, extra, cut=reply.cut_body)
        elif anthropic:
            document = anthropic_success(model, reply.text, reply.stop_reason, reply.input_tokens,
                                         reply.output_tokens, cache=_cache(reply),
                                         tool_call=reply.tool_call)  # fmt: skip
            self._send(reply.status, document, extra, cut=reply.cut_body)
        else:
            document = openai_success(model, reply.text, reply.stop_reason, reply.input_tokens,
                                      reply.output_tokens, reply.cost_usd,
                                      cache=_cache(reply), tool_call=reply.tool_call)  # fmt: skip
            self._send(reply.status, document, extra, cut=reply.cut_body)

    def _send(
        self,
        status: int,
        document: Any,
        extra: Sequence[tuple[str, str]] = (),
        *,
        cut: bool = False,
    ) -> None:
        self._send_bytes(status, json.dumps(document).encode(), extra, cut=cut)

    def _send_bytes(
        self, status: int, data: bytes, extra: Sequence[tuple[str, str]], *, cut: bool = False
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if not self._keep:
            self.send_header("Connection", "close")
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if cut else data)
        self.wfile.flush()
        self.close_connection = not self._keep

    def _stream(self, reply: Scripted, anthropic: bool, model: str) -> None:
        """Server-sent events in the path's format, with the reply's stream faults."""
        build = anthropic_stream if anthropic else openai_stream
        if self._responses:
            events = responses.stream(model, responses.new_id(), reply.text, reply.stop_reason,
                                      reply.input_tokens, reply.output_tokens,
                                      reply.stream_pieces, cache=_cache(reply),
                                      tool_call=reply.tool_call)  # fmt: skip
        else:
            events = build(model, reply.text, reply.stop_reason, reply.input_tokens,
                           reply.output_tokens, reply.stream_pieces,
                           cache=_cache(reply))  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        for name, value in self._limits(reply, anthropic, model):
            self.send_header(name, value)
        self.send_header("Transfer-Encoding" if self._keep else "Connection",
                         "chunked" if self._keep else "close")  # fmt: skip
        if reply.transport_error_after is not None:
            self.send_header("Content-Length", str(10**9))
        self.end_headers()
        self.wfile.flush()
        stopping = self.server.standin.stopping
        if reply.first_event_delay_s and stopping.wait(reply.first_event_delay_s):
            return
        faulted = _faulted(events, reply, anthropic)
        for i, event in enumerate(faulted):
            if event is _STALL:
                stopping.wait(600)
                return
            if event is _CUT:
                return
            if i == len(faulted) - 1:
                self._close_open()  # see StandIn.opened
            data = event[1]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self._keep else data)
            self.wfile.flush()
            if reply.event_delay_s and stopping.wait(reply.event_delay_s):
                return
        if self._keep:  # the last chunk; the connection stays open for the next request
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            self.close_connection = False
            return
        self.wfile.write(b"")  # the end: the connection closes after this

    def _trickle(self, reply: Scripted, extra: Sequence[tuple[str, str]]) -> None:
        """An error body one byte at a time, (nearly) endless, until the client or stop ends it."""
        status = reply.status if reply.status >= 300 else 503
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(10**9))
        self.send_header("Connection", "close")
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()
        stopping = self.server.standin.stopping
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            self.wfile.write(b" ")
            self.wfile.flush()
            if stopping.wait(reply.trickle_interval_s):
                return


def _fault_free(reply: Scripted) -> bool:
    """A successful reply without a connection-level fault (a keep-alive stand-in keeps its
    connection open after it; every other reply closes it)."""
    return reply.status < 300 and not (
        reply.reset or reply.cut_body or reply.trickle_body or reply.raw_body is not None
        or reply.cut_after is not None or reply.stall_after is not None
        or reply.malformed_after is not None or reply.no_terminator
        or reply.big_event_mib is not None or reply.error_event_after is not None
        or reply.transport_error_after is not None
    )  # fmt: skip


_STALL: StreamEvent = ("stall", b"")
_CUT: StreamEvent = ("cut", b"")
_MALFORMED = b"data: {this is not json\n\n"


def _faulted(
    events: Sequence[StreamEvent], reply: Scripted, anthropic: bool = False
) -> list[StreamEvent]:
    """The events as the reply's faults have them: cut, stalled, malformed, an error event,
    unterminated."""
    out: list[StreamEvent] = []
    content = 0
    for role, data in events:
        if role == "content" and content == 0 and reply.big_event_mib is not None:
            out.append(("preamble", _big_event(reply.big_event_mib)))
        if role == "usage" and reply.no_usage:
            continue
        if role == "terminator" and reply.no_terminator:
            continue
        if role in ("content", "finish"):
            if reply.cut_after is not None and content >= reply.cut_after:
                return [*out, _CUT]
            if reply.stall_after is not None and content >= reply.stall_after:
                return [*out, _STALL]
            if reply.malformed_after is not None and content == reply.malformed_after:
                out.append(("content", _MALFORMED))
                return [*out, _CUT]
            if reply.error_event_after is not None and content == reply.error_event_after:
                return [*out, ("content", _error_event(anthropic)), _CUT]
            if reply.transport_error_after is not None and content >= reply.transport_error_after:
                return [*out, _CUT]  # short of the Content-Length promised
        if role == "content":
            content += 1
        if role == "finish" and reply.no_usage:
            data = _without_usage(data)
        out.append((role, data))
    return out


def _error_event(anthropic: bool) -> bytes:
    """The error event a provider sends mid-stream (Anthropic's `event: error`; OpenAI's bare
    `data: {"error": …}`)."""
    document = error_json(anthropic, 529 if anthropic else 500, "overloaded_error")
    data = b"data: " + json.dumps(document).encode() + b"\n\n"
    return b"event: error\n" + data if anthropic else data


def _big_event(mib: int) -> bytes:
    """A ping (OpenAI: a chunk without choices) whose JSON spans `mib` lines of 1 MiB each."""
    line = b"data: " + b"0," * (512 * 1024) + b"\n"
    return b'data: {"type": "ping", "choices": [], "pad": [\n' + line * mib + b"data: 0]}\n\n"


def _without_usage(data: bytes) -> bytes:
    """An Anthropic message_delta without its usage (OpenAI's usage is a chunk of its own)."""
    head, _, payload = data.partition(b"data: ")
    try:
        document = json.loads(payload)
    except ValueError:
        return data
    if isinstance(document, dict):
        document.pop("usage", None)
    return head + b"data: " + json.dumps(document).encode() + b"\n\n"
