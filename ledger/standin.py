"""A local provider stand-in on 127.0.0.1 for tests and `ledger demo` (SPEC section 14).

Speaks the OpenAI-compatible chat-completions wire format (`POST /v1/chat/completions`, base URL
`http://127.0.0.1:PORT/v1`) and the Anthropic messages format (`POST /v1/messages`, base URL
`http://127.0.0.1:PORT`), replying per model id from a script.

Invariant: it never records a credential value (only whether one was sent), and stopping it is
prompt: every handler waits on the stop event, so a delayed or trickling reply ends at shutdown.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple

SECRET_HEADERS = frozenset({"authorization", "x-api-key", "proxy-authorization", "cookie"})
REDACTED = "<redacted>"
MAX_REQUEST_BYTES = 16 * 1024 * 1024

_OPENAI_PATH = "/v1/chat/completions"
_ANTHROPIC_PATH = "/v1/messages"

_DEFAULT_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


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
    output_tokens: int = 5
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
    ) -> None:
        self.default = default or Scripted()
        self._script: dict[str, list[Scripted]] = {
            model: list(replies) for model, replies in (script or {}).items()
        }
        self._lock = threading.Lock()
        self._stop = threading.Event()
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

    def record(self, request: ReceivedRequest, body: Any) -> None:
        """Remember one received request."""
        with self._lock:
            self._requests.append(request)
            self._bodies.append(body)

    @property
    def stopping(self) -> threading.Event:
        """Set when the stand-in is shutting down."""
        return self._stop


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins handlers; they end promptly at stop
    block_on_close = True
    standin: StandIn

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Client disconnects are part of the scripts; stay quiet."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"
    timeout = 10  # a stuck client cannot hold a handler thread forever

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: requests carry caller text."""

    def do_POST(self) -> None:
        """Serve one scripted reply in the wire format of the path."""
        standin = self.server.standin
        path = self.path.split("?", 1)[0]
        if path not in (_OPENAI_PATH, _ANTHROPIC_PATH):
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
        if model is None:
            self._send(400, _error_json(anthropic, 400, "invalid_request_error"))
            return
        reply = standin.next_reply(model)
        if reply.delay_s > 0 and standin.stopping.wait(reply.delay_s):
            return
        # The client may give up (its deadline, a bounded error read): that is expected.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
            self._reply(reply, anthropic, model)

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

    def _reply(self, reply: Scripted, anthropic: bool, model: str) -> None:
        extra = list(reply.headers)
        if reply.retry_after is not None:
            extra.append(("Retry-After", reply.retry_after))
        if reply.raw_body is not None:
            self._send_bytes(reply.status, reply.raw_body, extra)
        elif reply.trickle_body:
            self._trickle(reply, extra)
        elif reply.status >= 300:
            code = reply.error_code or _DEFAULT_ERROR_TYPES.get(reply.status, "api_error")
            document = _error_json(
                anthropic, reply.status, code, reply.error_body_bytes, reply.error_message
            )
            self._send(reply.status, document, extra)
        elif anthropic:
            self._send(reply.status, _anthropic_success(reply, model), extra, cut=reply.cut_body)
        else:
            self._send(reply.status, _openai_success(reply, model), extra, cut=reply.cut_body)

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
        self.send_header("Connection", "close")
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if cut else data)
        self.wfile.flush()

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


def _error_json(
    anthropic: bool,
    status: int,
    code: str,
    pad_to: int | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    message = "scripted error" if message is None else message
    if pad_to is not None and pad_to > len(message):
        message += "." * (pad_to - len(message))
    if anthropic:
        return {"type": "error", "error": {"type": code, "message": message}}
    return {"error": {"message": message, "type": code, "param": None, "code": code}}


def _openai_success(reply: Scripted, model: str) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }
    if reply.cost_usd is not None:
        usage["cost"] = reply.cost_usd
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.text},
                "finish_reason": reply.stop_reason or "stop",
            }
        ],
        "usage": usage,
    }


def _anthropic_success(reply: Scripted, model: str) -> dict[str, Any]:
    return {
        "id": "msg_standin",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": reply.text}],
        "stop_reason": reply.stop_reason or "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }
