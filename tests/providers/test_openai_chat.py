"""Issue 13 item 2: reasoning models (and OpenAI's own API) get `max_completion_tokens`."""

from __future__ import annotations

import json

import httpx
import pytest

from ledger.catalog import DATA_FILE, Model, Provider, known_providers
from ledger.kinds import AttemptRole
from ledger.providers import CallRequest, Message, ProviderResponse, adapter_for
from ledger.standin.server import StandIn
from ledger.worker.handler import Job

ENV = {"PROVIDER_KEY": "sk-test"}
MESSAGES = (Message("user", "hello"),)
FAR = 10_000  # the deadline, 10 s after the fixed now_ms() = 0 used here


def provider(base_url: str) -> Provider:
    return Provider.model_validate(
        {"api": "openai-chat", "baseUrl": base_url, "credentialEnv": "PROVIDER_KEY"}
    )


@pytest.mark.parametrize(
    ("reasoning", "field"), [(True, "max_completion_tokens"), (False, "max_tokens")]
)
def test_issue13_item2_token_limit_field_over_http(reasoning: bool, field: str) -> None:
    with StandIn() as standin:
        adapter = adapter_for(provider(standin.base_url_openai), ENV)
        request = CallRequest("o-mini", MESSAGES, 64, FAR, reasoning=reasoning)
        assert adapter.call(request, now_ms=lambda: 0).ok
        (body,) = standin.bodies
    assert body[field] == 64
    other = "max_tokens" if field == "max_completion_tokens" else "max_completion_tokens"
    assert other not in body


def test_issue13_item2_openai_api_always_gets_max_completion_tokens() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}]})

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        adapter = adapter_for(provider("https://api.openai.com/v1"), ENV, client=client)
        assert adapter.call(CallRequest("gpt-4o", MESSAGES, 9, FAR), now_ms=lambda: 0).ok
    (request,) = seen
    body = json.loads(request.content)
    assert body["max_completion_tokens"] == 9
    assert "max_tokens" not in body


@pytest.mark.parametrize("reasoning", [True, False])
def test_issue13_item2_job_call_passes_the_reasoning_flag(reasoning: bool) -> None:
    seen: list[CallRequest] = []

    def caller(request: CallRequest) -> ProviderResponse:
        seen.append(request)
        return ProviderResponse(ok=True, status=200, text="{}")

    model = Model(provider="openai", id="o3", reasoning=reasoning)
    job = Job(
        source_id="s",
        payload_ref=None,
        route=model.key,
        model=model,
        deadline_ms=FAR,
        reservation_id=1,
        role=AttemptRole.PRIMARY,
        correction_reason=None,
        max_tokens=100,
        caller=caller,
    )
    job.call(MESSAGES)
    assert seen[0].reasoning is reasoning


@pytest.mark.parametrize(
    ("name", "reasoning", "field"),
    [
        # LiteLLM maps max_completion_tokens -> max_tokens for these: they ignore or refuse it
        ("empiriolabs", True, "max_tokens"),
        ("mistral", True, "max_tokens"),
        ("xai", True, "max_tokens"),
        ("deepinfra", True, "max_tokens"),
        # and the reverse for this one
        ("streamlake", False, "max_completion_tokens"),
        # no mapping known: the reasoning flag decides
        ("groq", True, "max_completion_tokens"),
        ("groq", False, "max_tokens"),
    ],
)
def test_issue13_item2_known_endpoint_gets_the_field_it_honours(
    name: str, reasoning: bool, field: str
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}]})

    _, base_url = known_providers()[name]
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        adapter = adapter_for(provider(base_url), ENV, client=client)
        request = CallRequest("m", MESSAGES, 9, FAR, reasoning=reasoning)
        assert adapter.call(request, now_ms=lambda: 0).ok
    (sent,) = seen
    body = json.loads(sent.content)
    assert body[field] == 9
    other = "max_tokens" if field == "max_completion_tokens" else "max_completion_tokens"
    assert other not in body


def test_issue13_item2_token_fields_are_known_names_of_known_endpoints() -> None:
    document = json.loads(DATA_FILE.read_text())
    fields = {e.get("maxTokensField") for e in document.values()} - {None}
    assert fields == {"max_tokens", "max_completion_tokens"}
    for entry in document.values():
        assert set(entry) <= {"api", "baseUrl", "maxTokensField"}
