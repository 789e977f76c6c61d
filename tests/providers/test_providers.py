"""Provider adapters over real HTTP against the stand-in, plus MockTransport unit tests.

R-HTTP-1 (both wire formats), R-HTTP-2 (bounded error bodies), R-HTTP-3 (deadline), R-CAT-2 and
R-DIAG-3 (the credential never leaks).
"""

from __future__ import annotations

import json
import logging
import math
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.catalog import Provider
from ledger.clock import now_ms
from ledger.learned import read_limits
from ledger.providers import (
    INVALID_RESPONSE,
    CallRequest,
    Message,
    ProviderResponse,
    adapter_for,
)
from ledger.providers.anthropic_messages import AnthropicMessagesAdapter, parse_message
from ledger.providers.bounded import JsonReply, read_error_body
from ledger.providers.openai_chat import OpenAIChatAdapter, parse_chat_completion
from ledger.standin.server import REDACTED, Scripted, StandIn

SECRET = "sk-test-SECRET-credential-0123456789"
ENV = {"PROVIDER_KEY": SECRET}
APIS = ["openai-chat", "anthropic-messages"]
AUTH_HEADER = {"openai-chat": "authorization", "anthropic-messages": "x-api-key"}
MESSAGES = (Message("system", "be terse"), Message("user", "hello"))


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


def provider_for(
    api: str, base_url: str, *, credential: bool = True, options: dict[str, Any] | None = None
) -> Provider:
    data: dict[str, Any] = {"api": api, "baseUrl": base_url, "options": options or {}}
    data.update({"credentialEnv": "PROVIDER_KEY"} if credential else {"available": True})
    return Provider.model_validate(data)


def base_url(server: StandIn, api: str) -> str:
    return server.base_url_openai if api == "openai-chat" else server.base_url_anthropic


def call(
    server: StandIn,
    api: str,
    model: str = "m",
    *,
    deadline_in_ms: int = 5000,
    env: dict[str, str] = ENV,
    credential: bool = True,
    options: dict[str, Any] | None = None,
) -> ProviderResponse:
    adapter = adapter_for(
        provider_for(api, base_url(server, api), credential=credential, options=options), env
    )
    request = CallRequest(model, MESSAGES, 100, now_ms() + deadline_in_ms)
    return adapter.call(request, now_ms=now_ms)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------ R-HTTP-1 success


@pytest.mark.parametrize(
    ("api", "stop"), [("openai-chat", "stop"), ("anthropic-messages", "end_turn")]
)
def test_r_http_1_success_with_usage_and_stop_reason(standin: StandIn, api: str, stop: str) -> None:
    standin.set_script("m", [Scripted(text="answer", input_tokens=12, output_tokens=3)])
    response = call(standin, api)
    assert response.ok
    assert (response.status, response.text, response.stop_reason) == (200, "answer", stop)
    assert (response.input_tokens, response.output_tokens) == (12, 3)
    assert response.exception is None
    assert response.error_body is None
    # a 2xx's headers are kept, lower-cased: its rate-limit headers are learned (R-TOK-4)
    assert response.headers["content-type"] == "application/json"
    assert read_limits(response.headers, now_ms()) is not None
    assert 0 <= response.elapsed_ms < 5000
    (received,) = standin.requests
    assert received.model == "m"
    assert received.path == ("/v1/chat/completions" if api == "openai-chat" else "/v1/messages")
    assert received.headers[AUTH_HEADER[api]] == REDACTED


def test_r_http_1_openai_body_and_reported_cost(standin: StandIn) -> None:
    standin.set_script("m", [Scripted(cost_usd=0.0125)])
    response = call(standin, "openai-chat", options={"headers": {"X-Title": "ledger"}})
    assert response.cost_usd == pytest.approx(0.0125)
    (body,) = standin.bodies
    assert body == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be terse"},
            {"role": "user", "content": "hello"},
        ],
        "max_tokens": 100,
    }
    assert standin.requests[0].headers["x-title"] == "ledger"


@pytest.mark.parametrize(
    ("options", "version"),
    [({}, "2023-06-01"), ({"anthropicVersion": "2099-01-01"}, "2099-01-01")],
)
def test_r_http_1_anthropic_system_and_version(
    standin: StandIn, options: dict[str, Any], version: str
) -> None:
    response = call(standin, "anthropic-messages", options=options)
    assert response.ok
    assert response.cost_usd is None
    (body,) = standin.bodies
    assert body == {
        "model": "m",
        "max_tokens": 100,
        "system": "be terse",
        "messages": [{"role": "user", "content": "hello"}],
    }
    assert standin.requests[0].headers["anthropic-version"] == version


def test_r_http_1_model_id_may_contain_slash(standin: StandIn) -> None:
    assert call(standin, "openai-chat", model="meta/llama-3.1-8b").ok
    assert standin.requests[0].model == "meta/llama-3.1-8b"


@pytest.mark.parametrize(
    ("api", "stop"), [("openai-chat", "length"), ("anthropic-messages", "max_tokens")]
)
def test_r_http_1_truncated_output_keeps_raw_stop_reason(
    standin: StandIn, api: str, stop: str
) -> None:
    standin.set_script("m", [Scripted(text='{"ok": tr', stop_reason=stop)])
    response = call(standin, api)
    assert response.ok
    assert response.stop_reason == stop
    assert response.text == '{"ok": tr'


# ------------------------------------------------------------------ R-HTTP-2 error responses

# The code each API's own error body carries (OpenAI: error.code, else error.type; Anthropic:
# error.type), as the strict stand-in sends them (issue 13 item 4).
ERROR_CASES = [
    pytest.param(Scripted(status=401), ("invalid_api_key", "authentication_error"), id="401"),
    pytest.param(
        Scripted(status=402, error_code="insufficient_quota"),
        ("insufficient_quota", "insufficient_quota"),
        id="402-quota",
    ),
    pytest.param(
        Scripted(status=429, retry_after="7"),
        ("rate_limit_exceeded", "rate_limit_error"),
        id="429-retry-after",
    ),
    pytest.param(Scripted(status=503), ("server_error", "api_error"), id="503"),
    pytest.param(
        Scripted(status=400, error_code="context_length_exceeded"),
        ("context_length_exceeded", "context_length_exceeded"),
        id="400-context",
    ),
]


def error_code_of(api: str, body: bytes) -> str:
    document = json.loads(body)
    if api == "openai-chat":
        return str(document["error"]["code"] or document["error"]["type"])
    assert document["type"] == "error"
    return str(document["error"]["type"])


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(("reply", "code"), ERROR_CASES)
def test_r_http_2_error_status_headers_and_bounded_body(
    standin: StandIn, api: str, reply: Scripted, code: tuple[str, str]
) -> None:
    standin.set_script("m", [reply])
    response = call(standin, api)
    assert not response.ok
    assert response.status == reply.status
    assert response.exception is None
    assert response.text is None
    assert response.error_body is not None
    assert len(response.error_body) <= 8192
    assert error_code_of(api, response.error_body) == code[api != "openai-chat"]
    assert all(name == name.lower() for name in response.headers)
    if reply.retry_after is not None:
        assert response.headers["retry-after"] == reply.retry_after


@pytest.mark.parametrize("api", APIS)
def test_r_http_2_large_error_body_is_cut_at_8192_bytes(standin: StandIn, api: str) -> None:
    standin.set_script("m", [Scripted(status=400, error_body_bytes=1_000_000)])
    response = call(standin, api)
    assert response.status == 400
    assert response.error_body is not None
    assert len(response.error_body) == 8192


@pytest.mark.timeout(10)
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("interval_s", [0.05, 5.0], ids=["trickle", "stall"])
def test_r_http_2_slow_endless_error_body_cannot_stall(
    standin: StandIn, api: str, interval_s: float
) -> None:
    standin.set_script(
        "m", [Scripted(status=503, trickle_body=True, trickle_interval_s=interval_s)]
    )
    started = time.monotonic()
    response = call(standin, api, deadline_in_ms=30_000)
    assert time.monotonic() - started < 1.5
    assert response.status == 503
    assert response.error_body is not None
    assert 1 <= len(response.error_body) <= 8192


@pytest.mark.timeout(10)
def test_r_http_2_read_error_body_bounds_a_trickling_mock_stream() -> None:
    def endless() -> Iterator[bytes]:
        while True:
            time.sleep(0.05)
            yield b"x"

    transport = httpx.MockTransport(lambda request: httpx.Response(500, content=endless()))
    with httpx.Client(transport=transport) as client, client.stream("POST", "http://p/") as r:
        started = time.monotonic()
        body = read_error_body(r)
        assert time.monotonic() - started < 0.5
        assert r.is_closed
    assert 1 <= len(body) <= 8


def test_r_http_2_read_error_body_respects_limit() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(500, content=b"y" * 50_000))
    with httpx.Client(transport=transport) as client, client.stream("POST", "http://p/") as r:
        assert read_error_body(r, limit=100) == b"y" * 100


# ------------------------------------------------------------------ R-HTTP-3 transport, deadline


@pytest.mark.parametrize("api", APIS)
def test_r_http_3_connect_error_is_reported_not_raised(api: str) -> None:
    provider = provider_for(api, f"http://127.0.0.1:{closed_port()}")
    request = CallRequest("m", MESSAGES, 100, now_ms() + 5000)
    response = adapter_for(provider, ENV).call(request, now_ms=now_ms)
    assert not response.ok
    assert response.status is None
    assert isinstance(response.exception, httpx.ConnectError)


@pytest.mark.parametrize("api", APIS)
def test_r_http_3_reply_past_the_deadline_times_out_near_it(standin: StandIn, api: str) -> None:
    standin.set_script("m", [Scripted(delay_s=5.0)])
    response = call(standin, api, deadline_in_ms=300)
    assert not response.ok
    assert response.status is None
    assert isinstance(response.exception, httpx.TimeoutException)
    assert 250 <= response.elapsed_ms < 1500


@pytest.mark.parametrize("api", APIS)
def test_r_http_3_nothing_is_sent_after_the_deadline(standin: StandIn, api: str) -> None:
    response = call(standin, api, deadline_in_ms=-1)
    assert isinstance(response.exception, httpx.TimeoutException)
    assert standin.requests == []


def test_r_http_3_success_body_arriving_after_the_deadline_times_out() -> None:
    def slow() -> Iterator[bytes]:
        yield b'{"choices": '
        time.sleep(0.3)
        yield b"[]}"

    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=slow()))
    with httpx.Client(transport=transport) as client:
        adapter = adapter_for(provider_for("openai-chat", "http://p/v1"), ENV, client=client)
        response = adapter.call(CallRequest("m", MESSAGES, 10, now_ms() + 150), now_ms=now_ms)
    assert isinstance(response.exception, httpx.ReadTimeout)


@pytest.mark.parametrize("api", APIS)
def test_r_http_3_stream_cut_is_a_transport_exception(standin: StandIn, api: str) -> None:
    standin.set_script("m", [Scripted(cut_body=True)])
    response = call(standin, api)
    assert response.status is None
    assert isinstance(response.exception, httpx.TransportError)


# ------------------------------------------------------------------ invalid success bodies


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("raw", [b"not json", b"{}", b"[1, 2]", b'{"choices": [], "content": 3}'])
def test_r_http_2_unparsable_success_body_is_invalid_response(
    standin: StandIn, api: str, raw: bytes
) -> None:
    standin.set_script("m", [Scripted(raw_body=raw)])
    response = call(standin, api)
    assert (response.ok, response.status, response.stop_reason) == (False, 200, INVALID_RESPONSE)
    assert response.exception is None
    assert response.text is None


def test_r_http_2_oversized_success_body_is_invalid_response() -> None:
    big = b"[" + b"0," * (9 * 1024 * 1024) + b"0]"
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=big))
    with httpx.Client(transport=transport) as client:
        adapter = adapter_for(provider_for("openai-chat", "http://p/v1"), ENV, client=client)
        response = adapter.call(CallRequest("m", MESSAGES, 10, now_ms() + 5000), now_ms=now_ms)
    assert (response.ok, response.status, response.stop_reason) == (False, 200, INVALID_RESPONSE)


def reply(data: object) -> JsonReply:
    return JsonReply(status=200, data=data, started=time.monotonic())


OPENAI_SHAPES = [
    pytest.param({"choices": [{"message": {"content": 5}, "finish_reason": "stop"}]}, id="content"),
    pytest.param({"choices": [{"message": "x", "finish_reason": "stop"}]}, id="message"),
    pytest.param({"choices": [{"message": {"content": "x"}, "finish_reason": 1}]}, id="finish"),
    pytest.param({"choices": ["x"]}, id="choice"),
    pytest.param({"choices": {}}, id="choices"),
]


@pytest.mark.parametrize("data", OPENAI_SHAPES)
def test_r_http_2_openai_wrong_shapes_are_invalid(data: object) -> None:
    assert parse_chat_completion(reply(data)).stop_reason == INVALID_RESPONSE


@pytest.mark.parametrize(
    "data",
    [
        {"content": "x", "stop_reason": "end_turn"},
        {"content": [{"type": "text", "text": 1}], "stop_reason": "end_turn"},
        {"content": ["x"], "stop_reason": "end_turn"},
        {"content": [], "stop_reason": 7},
    ],
)
def test_r_http_2_anthropic_wrong_shapes_are_invalid(data: object) -> None:
    assert parse_message(reply(data)).stop_reason == INVALID_RESPONSE


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 3, "completion_tokens": 4, "cost": 0.5}, (3, 4, 0.5)),
        ({"prompt_tokens": True, "completion_tokens": -1, "cost": -2}, (None, None, None)),
        ({"prompt_tokens": "3", "completion_tokens": 4.5, "cost": math.inf}, (None, None, None)),
        ("garbage", (None, None, None)),
    ],
)
def test_r_http_1_openai_usage_is_taken_only_when_plausible(
    usage: object, expected: tuple[int | None, int | None, float | None]
) -> None:
    data = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}], "usage": usage}
    response = parse_chat_completion(reply(data))
    assert response.ok
    assert (response.input_tokens, response.output_tokens, response.cost_usd) == expected


def test_r_http_1_openai_refusal_is_reported_as_stop_reason() -> None:
    data = {"choices": [{"message": {"content": None, "refusal": "no"}, "finish_reason": "stop"}]}
    response = parse_chat_completion(reply(data))
    assert (response.ok, response.stop_reason, response.text) == (True, "refusal", "")


def test_r_http_1_anthropic_joins_text_blocks_only() -> None:
    data = {
        "content": [
            {"type": "thinking", "thinking": "hmm"},
            {"type": "text", "text": "a"},
            {"type": "text", "text": "b"},
        ],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 2},
    }
    response = parse_message(reply(data))
    assert (response.text, response.input_tokens, response.output_tokens) == ("ab", 1, 2)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "message",
                    "content",
                    "finish_reason",
                    "usage",
                    "stop_reason",
                    "type",
                    "text",
                    "prompt_tokens",
                    "input_tokens",
                    "cost",
                    "refusal",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_r_http_2_any_json_success_body_gives_facts_never_an_exception(data: object) -> None:
    for parse in (parse_chat_completion, parse_message):
        response = parse(reply(data))
        assert response.ok or response.stop_reason == INVALID_RESPONSE
        assert response.ok == isinstance(response.text, str)


# ------------------------------------------------------------------ MockTransport request shape


def capture(
    status: int = 200, document: object = None, headers: dict[str, str] | None = None
) -> tuple[list[httpx.Request], Callable[[httpx.Request], httpx.Response]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=document or {}, headers=headers)

    return seen, handler


def test_r_http_1_openai_request_shape_on_the_wire() -> None:
    seen, handler = capture(document={"choices": [{"message": {"content": "x"}}]})
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        adapter = adapter_for(provider_for("openai-chat", "https://o.test/v1/"), ENV, client=client)
        assert isinstance(adapter, OpenAIChatAdapter)
        assert adapter.call(CallRequest("m", MESSAGES, 7, now_ms() + 5000), now_ms=now_ms).ok
    (request,) = seen
    assert str(request.url) == "https://o.test/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert json.loads(request.content)["max_tokens"] == 7


def test_r_http_1_anthropic_request_shape_on_the_wire() -> None:
    seen, handler = capture(document={"content": [], "stop_reason": "end_turn"})
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        provider = provider_for("anthropic-messages", "https://a.test")
        adapter = adapter_for(provider, ENV, client=client)
        assert isinstance(adapter, AnthropicMessagesAdapter)
        assert adapter.call(CallRequest("m", MESSAGES, 7, now_ms() + 5000), now_ms=now_ms).ok
    (request,) = seen
    assert str(request.url) == "https://a.test/v1/messages"
    assert request.headers["x-api-key"] == SECRET
    assert "authorization" not in request.headers


def test_r_http_2_error_headers_are_lower_cased_and_kept() -> None:
    _, handler = capture(429, {"error": {"code": "x"}}, {"Retry-After": "30", "X-Reset": "1s"})
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        adapter = adapter_for(provider_for("openai-chat", "http://p/v1"), ENV, client=client)
        response = adapter.call(CallRequest("m", MESSAGES, 7, now_ms() + 5000), now_ms=now_ms)
    assert response.headers["retry-after"] == "30"
    assert response.headers["x-reset"] == "1s"


def test_r_http_3_deadline_uses_the_injected_clock() -> None:
    seen, handler = capture()
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        adapter = adapter_for(provider_for("openai-chat", "http://p/v1"), ENV, client=client)
        response = adapter.call(CallRequest("m", MESSAGES, 7, 1_000), now_ms=lambda: 1_000)
    assert isinstance(response.exception, httpx.TimeoutException)
    assert seen == []


# ------------------------------------------------------------------ R-CAT-2, R-DIAG-3


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("credential", "env"),
    [(False, ENV), (True, {}), (True, {"PROVIDER_KEY": ""})],
    ids=["no-credential-env", "variable-unset", "variable-empty"],
)
def test_r_cat_2_no_credential_sends_no_auth_header(
    standin: StandIn, api: str, credential: bool, env: dict[str, str]
) -> None:
    response = call(standin, api, credential=credential, env=env)
    # Anthropic's API (and the strict stand-in) refuses a request without x-api-key.
    assert response.ok if api == "openai-chat" else response.status == 401
    headers = standin.requests[0].headers
    assert "authorization" not in headers
    assert "x-api-key" not in headers


LEAK_SCRIPTS = [
    pytest.param(Scripted(), id="success"),
    pytest.param(Scripted(status=401), id="401"),
    pytest.param(Scripted(status=503, trickle_body=True), id="trickle"),
    pytest.param(Scripted(delay_s=3.0), id="timeout"),
    pytest.param(Scripted(cut_body=True), id="cut"),
]


def assert_secret_absent(response: ProviderResponse, adapter: object) -> None:
    texts = [repr(adapter), str(adapter), repr(response), str(response)]
    texts += [repr(dict(response.headers)), repr(response.error_body), repr(response.text)]
    exc = response.exception
    if exc is not None:
        texts += [str(exc), repr(exc), repr(exc.args)]
        assert exc.__traceback__ is None
        assert exc.__context__ is None
        assert exc.__cause__ is None
        if isinstance(exc, httpx.RequestError):
            with pytest.raises(RuntimeError):
                _ = exc.request  # the request (and its headers) is not kept
    for text in texts:
        assert SECRET not in text


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("script", LEAK_SCRIPTS)
def test_r_diag_3_credential_never_in_repr_response_exception_or_log(
    standin: StandIn, api: str, script: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    standin.set_script("m", [script])
    adapter = adapter_for(provider_for(api, base_url(standin, api)), ENV)
    with caplog.at_level(logging.DEBUG):
        response = adapter.call(CallRequest("m", MESSAGES, 10, now_ms() + 400), now_ms=now_ms)
    assert_secret_absent(response, adapter)
    assert SECRET not in caplog.text
    assert "hello" not in caplog.text  # request text is not logged either
    assert SECRET not in repr(standin.requests)


@pytest.mark.parametrize("api", APIS)
def test_r_diag_3_connect_error_does_not_leak(api: str) -> None:
    adapter = adapter_for(provider_for(api, f"http://127.0.0.1:{closed_port()}"), ENV)
    response = adapter.call(CallRequest("m", MESSAGES, 10, now_ms() + 2000), now_ms=now_ms)
    assert response.exception is not None
    assert_secret_absent(response, adapter)


def test_r_diag_3_request_and_response_reprs_hide_text() -> None:
    request = CallRequest("m", (Message("user", "private words"),), 1, 0)
    response = ProviderResponse(ok=True, status=200, text="model words", error_body=b"body words")
    assert "private words" not in repr(request)
    assert "model words" not in repr(response)
    assert "body words" not in repr(response)


def test_r_diag_3_unencodable_credential_is_a_fact_not_an_exception() -> None:
    from ledger.catalog import Provider
    from ledger.classify import classify_exception
    from ledger.providers import CallRequest, Message, adapter_for

    secret = "sk-ünïcode-SECRET"
    provider = Provider.model_validate(
        {"credentialEnv": "X_KEY", "api": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1"}
    )
    adapter = adapter_for(provider, {"X_KEY": secret})
    request = CallRequest("m", (Message("user", "hi"),), 16, deadline_ms=10**15)
    response = adapter.call(request, now_ms=lambda: 0)
    assert not response.ok
    assert response.exception is not None
    assert "SECRET" not in repr(response.exception)
    assert classify_exception(response.exception).kind == "unknown"
