"""Issue 13 item 4: the stand-in speaks the real wire formats, checked with the official SDKs.

Every scripted reply is fetched twice over real HTTP on 127.0.0.1: once with the official `openai`
or `anthropic` SDK (dev dependencies), whose own types must parse it or whose own exception class
must be raised, and once with our adapter, whose classification must be the row's policy kind.
The rows are the error policy table's triggers (SPEC section 8). A second table checks that the
stand-in refuses what the real APIs refuse.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import Message as AnthropicMessage
from openai.types.chat import ChatCompletion

from ledger.catalog import Provider
from ledger.classify import Classification
from ledger.kinds import FailureKind as K
from ledger.providers import CallRequest, Message, adapter_for
from ledger.standin.server import Scripted, StandIn
from ledger.worker.queue import classify_response

KEY = "sk-standin-sdk-test"
ENV = {"SDK_TEST_KEY": KEY}
MODEL = "m"
OPENAI_ERROR_TYPES = frozenset(
    {"invalid_request_error", "insufficient_quota", "requests", "tokens", "server_error"}
)
ANTHROPIC_VERSION = "2023-06-01"


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


def now_ms() -> int:
    return int(time.time() * 1000)


def ours(standin: StandIn, api: str, reasoning: bool = False) -> Classification | None:
    """Our adapter and classification over real HTTP (as the worker does it)."""
    base = standin.base_url_openai if api == "openai" else standin.base_url_anthropic
    provider = Provider.model_validate(
        {
            "api": "openai-chat" if api == "openai" else "anthropic-messages",
            "baseUrl": base,
            "credentialEnv": "SDK_TEST_KEY",
        }
    )
    request = CallRequest(
        MODEL, (Message("system", "be terse"), Message("user", "hi")), 64, now_ms() + 5000,
        reasoning=reasoning,
    )  # fmt: skip
    response = adapter_for(provider, ENV).call(request, now_ms=now_ms)
    return classify_response(response, now_ms())


def openai_client(standin: StandIn) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=KEY, base_url=standin.base_url_openai, max_retries=0, timeout=5.0
    )


def anthropic_client(standin: StandIn) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key=KEY, base_url=standin.base_url_anthropic, max_retries=0, timeout=5.0
    )


def sdk_openai(standin: StandIn) -> ChatCompletion:
    raw = openai_client(standin).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}],
        max_completion_tokens=64,
    )
    # Validate (not just construct) the body with the SDK's own type.
    return ChatCompletion.model_validate(raw.http_response.json(), strict=False)


def sdk_anthropic(standin: StandIn) -> AnthropicMessage:
    raw = anthropic_client(standin).messages.with_raw_response.create(
        model=MODEL,
        system="be terse",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=64,
    )
    return AnthropicMessage.model_validate(raw.http_response.json())


def kind_of(found: Classification | None) -> K | None:
    return None if found is None else found.kind


# ------------------------------------------------------------------------------ error rows

ErrorRow = tuple[str, Scripted, type[Exception], K]
OPENAI_ERRORS: list[ErrorRow] = [
    ("401", Scripted(status=401), openai.AuthenticationError, K.AUTH),
    ("403", Scripted(status=403), openai.PermissionDeniedError, K.AUTH),
    ("402", Scripted(status=402), openai.APIStatusError, K.QUOTA),
    ("429-insufficient_quota", Scripted(status=429, error_code="insufficient_quota"),
     openai.RateLimitError, K.QUOTA),
    ("429", Scripted(status=429, retry_after="7"), openai.RateLimitError, K.RATE_LIMIT),
    ("408", Scripted(status=408), openai.APIStatusError, K.TRANSPORT),
    ("500", Scripted(status=500), openai.InternalServerError, K.TRANSPORT),
    ("503", Scripted(status=503), openai.InternalServerError, K.TRANSPORT),
    ("400-context", Scripted(status=400, error_code="context_length_exceeded"),
     openai.BadRequestError, K.REQUEST_REJECTED),
    ("400", Scripted(status=400), openai.BadRequestError, K.REQUEST_REJECTED),
    ("404", Scripted(status=404), openai.NotFoundError, K.REQUEST_REJECTED),
    ("422", Scripted(status=422), openai.UnprocessableEntityError, K.REQUEST_REJECTED),
]  # fmt: skip
ANTHROPIC_ERRORS: list[ErrorRow] = [
    ("401", Scripted(status=401), anthropic.AuthenticationError, K.AUTH),
    ("403", Scripted(status=403), anthropic.PermissionDeniedError, K.AUTH),
    ("402", Scripted(status=402), anthropic.PaymentRequiredError, K.QUOTA),
    ("429", Scripted(status=429, retry_after="7"), anthropic.RateLimitError, K.RATE_LIMIT),
    ("429-enforced_spend_limit", Scripted(status=429,
     error_detail_code="enforced_spend_limit_reached"),
     anthropic.EnforcedSpendLimitReachedError, K.QUOTA),
    ("429-contract_spend_limit", Scripted(status=429,
     error_detail_code="contract_spend_limit_reached"),
     anthropic.ContractSpendLimitReachedError, K.QUOTA),
    ("429-ramp_limit", Scripted(status=429, error_detail_code="ramp_limit_exceeded"),
     anthropic.RampLimitExceededError, K.QUOTA),
    ("408", Scripted(status=408), anthropic.RequestTimeoutError, K.TRANSPORT),
    ("500", Scripted(status=500), anthropic.InternalServerError, K.TRANSPORT),
    ("503", Scripted(status=503), anthropic.ServiceUnavailableError, K.TRANSPORT),
    ("529", Scripted(status=529), anthropic.OverloadedError, K.TRANSPORT),
    ("400", Scripted(status=400), anthropic.BadRequestError, K.REQUEST_REJECTED),
    ("413", Scripted(status=413), anthropic.ContentTooLargeError, K.REQUEST_REJECTED),
    ("404", Scripted(status=404), anthropic.NotFoundError, K.REQUEST_REJECTED),
    ("422", Scripted(status=422), anthropic.UnprocessableEntityError, K.REQUEST_REJECTED),
]  # fmt: skip


ERROR_ROWS = [("openai", *r) for r in OPENAI_ERRORS] + [("anthropic", *r) for r in ANTHROPIC_ERRORS]


@pytest.mark.parametrize(
    ("api", "row", "reply", "sdk_error", "kind"),
    ERROR_ROWS,
    ids=[f"{r[0]}-{r[1]}" for r in ERROR_ROWS],
)
def test_issue13_item4_errors_raise_the_sdk_class_and_classify_as_the_row(
    standin: StandIn, api: str, row: str, reply: Scripted, sdk_error: type[Exception], kind: K
) -> None:
    """Each error row of either wire format: the official SDK raises its own class for it, and
    our adapter classifies it as the row says."""
    standin.set_script(MODEL, [reply, reply])
    with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as info:
        sdk_openai(standin) if api == "openai" else sdk_anthropic(standin)
    error = info.value
    assert type(error) is sdk_error  # the SDK of the wire format asked for, its own class
    assert isinstance(error, (openai.APIStatusError, anthropic.APIStatusError))
    assert error.status_code == reply.status
    if isinstance(error, openai.APIStatusError):  # OpenAI's type names, not Anthropic's
        assert error.type in OPENAI_ERROR_TYPES
    assert kind_of(ours(standin, api)) is kind


# ------------------------------------------------------------------------------ success rows

OPENAI_STOPS: list[tuple[str, K | None]] = [
    ("stop", None),
    ("length", K.INVALID_OUTPUT),
    ("content_filter", K.SAFETY),
    ("tool_calls", None),
]
ANTHROPIC_STOPS: list[tuple[str, K | None]] = [
    ("end_turn", None),
    ("stop_sequence", None),
    ("max_tokens", K.INVALID_OUTPUT),
    ("model_context_window_exceeded", K.INVALID_OUTPUT),
    ("pause_turn", K.INVALID_OUTPUT),
    ("refusal", K.SAFETY),
]


@pytest.mark.parametrize(("stop", "kind"), OPENAI_STOPS)
@pytest.mark.parametrize("reasoning", [False, True])
def test_issue13_item4_openai_replies_parse_with_the_sdk_types(
    standin: StandIn, stop: str, kind: K | None, reasoning: bool
) -> None:
    reply = Scripted(text='{"ok": true}', stop_reason=stop, input_tokens=11, output_tokens=4)
    standin.set_script(MODEL, [reply, reply])
    completion = sdk_openai(standin)
    assert completion.choices[0].finish_reason == stop
    assert completion.choices[0].message.content == '{"ok": true}'
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 11
    assert completion.created > 0
    assert kind_of(ours(standin, "openai", reasoning)) is kind


@pytest.mark.parametrize(("stop", "kind"), ANTHROPIC_STOPS)
def test_issue13_item4_anthropic_replies_parse_with_the_sdk_types(
    standin: StandIn, stop: str, kind: K | None
) -> None:
    reply = Scripted(text='{"ok": true}', stop_reason=stop, input_tokens=11, output_tokens=4)
    standin.set_script(MODEL, [reply, reply])
    message = sdk_anthropic(standin)
    assert message.stop_reason == stop
    assert message.usage.input_tokens == 11
    assert [block.type for block in message.content] == ["text"]
    assert kind_of(ours(standin, "anthropic")) is kind


# ------------------------------------------------------------------------------ strict requests

GOOD_OPENAI: dict[str, Any] = {
    "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
}  # fmt: skip
GOOD_ANTHROPIC: dict[str, Any] = {
    "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
}  # fmt: skip
ANTHROPIC_HEADERS = {"x-api-key": KEY, "anthropic-version": ANTHROPIC_VERSION}


def _without(document: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != key}


REFUSED: list[tuple[str, str, dict[str, Any], dict[str, str], int, str]] = [
    ("anthropic-no-key", "anthropic", GOOD_ANTHROPIC, {"anthropic-version": ANTHROPIC_VERSION},
     401, "authentication_error"),
    ("anthropic-no-version", "anthropic", GOOD_ANTHROPIC, {"x-api-key": KEY},
     400, "invalid_request_error"),
    ("anthropic-no-max-tokens", "anthropic", _without(GOOD_ANTHROPIC, "max_tokens"),
     ANTHROPIC_HEADERS, 400, "invalid_request_error"),
    ("anthropic-system-role", "anthropic", {**GOOD_ANTHROPIC, "messages": [
        {"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]},
     ANTHROPIC_HEADERS, 400, "invalid_request_error"),
    ("anthropic-no-messages", "anthropic", {**GOOD_ANTHROPIC, "messages": []},
     ANTHROPIC_HEADERS, 400, "invalid_request_error"),
    ("anthropic-unknown-field", "anthropic", {**GOOD_ANTHROPIC, "max_completion_tokens": 5},
     ANTHROPIC_HEADERS, 400, "invalid_request_error"),
    ("openai-no-messages", "openai", _without(GOOD_OPENAI, "messages"), {},
     400, "invalid_request_error"),
    ("openai-empty-messages", "openai", {**GOOD_OPENAI, "messages": []}, {},
     400, "invalid_request_error"),
    ("openai-unknown-field", "openai", {**GOOD_OPENAI, "max_tokens_to_sample": 5}, {},
     400, "invalid_request_error"),
    ("openai-bad-role", "openai", {**GOOD_OPENAI, "messages": [{"role": "human", "content": "x"}]},
     {}, 400, "invalid_request_error"),
    ("openai-two-limits", "openai", {**GOOD_OPENAI, "max_completion_tokens": 5}, {},
     400, "invalid_request_error"),
    ("openai-no-model", "openai", _without(GOOD_OPENAI, "model"), {},
     400, "invalid_request_error"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("row", "api", "body", "headers", "status", "error_type"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_issue13_item4_standin_refuses_what_the_real_api_refuses(
    standin: StandIn,
    row: str,
    api: str,
    body: dict[str, Any],
    headers: dict[str, str],
    status: int,
    error_type: str,
) -> None:
    path = "/v1/chat/completions" if api == "openai" else "/v1/messages"
    response = httpx.post(f"{standin.base_url_anthropic}{path}", json=body, headers=headers)
    assert response.status_code == status
    document = response.json()
    if api == "anthropic":
        assert document["type"] == "error"
    assert document["error"]["type"] == error_type


@pytest.mark.parametrize(
    ("api", "body", "headers"),
    [("openai", GOOD_OPENAI, {}), ("anthropic", GOOD_ANTHROPIC, ANTHROPIC_HEADERS)],
)
def test_issue13_item4_standin_accepts_a_well_formed_request(
    standin: StandIn, api: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    path = "/v1/chat/completions" if api == "openai" else "/v1/messages"
    response = httpx.post(f"{standin.base_url_anthropic}{path}", json=body, headers=headers)
    assert response.status_code == 200
