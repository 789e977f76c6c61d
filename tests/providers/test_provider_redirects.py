"""Issue 13 item 1: a credential never follows a redirect to another host (real HTTP on loopback).

httpx drops only `Authorization` on a cross-origin redirect; Anthropic's `x-api-key` and the
catalog's `options.headers` would be forwarded. The adapters therefore never follow a redirect,
whatever client a library caller hands in.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from ledger.catalog import Provider
from ledger.providers import CallRequest, Message, adapter_for

SECRET = "sk-rev2-redirect-never-forwarded"
OPTION_SECRET = "opt-rev2-header-never-forwarded"


class _Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, location: str | None) -> None:
        super().__init__((host, 0), _Handler)
        self.location = location
        self.seen: list[dict[str, str]] = []


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.server.seen.append({k.lower(): v for k, v in self.headers.items()})
        if self.server.location is not None:
            self.send_response(307)
            self.send_header("location", self.server.location)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        body = b'{"content": [], "stop_reason": "end_turn", "choices": []}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def serving(host: str, location: str | None = None) -> Iterator[_Recorder]:
    server = _Recorder(host, location)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("api", ["anthropic-messages", "openai-chat"])
@pytest.mark.parametrize("follow", [True, False])
def test_issue13_item1_credential_never_follows_redirect_to_another_host(
    api: str, follow: bool
) -> None:
    # 127.0.0.2 is another host (another origin) on the loopback range.
    with serving("127.0.0.2") as elsewhere:
        path = "/v1/messages" if api == "anthropic-messages" else "/v1/chat/completions"
        target = f"http://127.0.0.2:{elsewhere.server_address[1]}{path}"
        with serving("127.0.0.1", location=target) as origin:
            base = f"http://127.0.0.1:{origin.server_address[1]}"
            provider = Provider.model_validate(
                {
                    "credentialEnv": "REV2_KEY",
                    "api": api,
                    "baseUrl": base if api == "anthropic-messages" else f"{base}/v1",
                    "options": {"headers": {"x-extra-secret": OPTION_SECRET}},
                }
            )
            request = CallRequest("m", (Message("user", "hi"),), 16, 10_000)
            with httpx.Client(follow_redirects=follow) as client:
                response = adapter_for(provider, {"REV2_KEY": SECRET}, client=client).call(
                    request, now_ms=lambda: 0
                )
    assert len(origin.seen) == 1
    sent = origin.seen[0]
    assert SECRET in (sent.get("x-api-key"), sent.get("authorization", "").removeprefix("Bearer "))
    assert elsewhere.seen == []  # nothing, and so no credential, reached the other host
    assert response.ok is False
    assert response.status == 307
