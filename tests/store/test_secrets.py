"""R-DIAG-3 (with R-CAT-2, R-HTTP-2, R-CFG-3): nothing shown or stored contains a credential, an
error body or model text.

A credential, error-body text, an unknown error code, a response header, model text and prompt
text each carry a unique marker. Failures and successes run through the real path: reserve ->
HTTP adapter against the stand-in on 127.0.0.1 -> classify -> settle. Then no marker may appear
in the database files, in any diagnostic command's output, or in the captured logs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.api import Ledger
from ledger.classify import (
    classify_exception,
    classify_http,
    classify_kind,
    classify_stop_reason,
)
from ledger.clock import now_ms
from ledger.errors import Refused
from ledger.providers import INVALID_RESPONSE, CallRequest, Message, ProviderResponse, adapter_for
from ledger.records import Failed, Outcome, SettleResult, Success
from ledger.standin.server import Scripted, StandIn

CREDENTIAL = "sk-MARKER-CRED-7f3a9c2e"
ERROR_TEXT = "MARKER-ERRBODY-51be77"
ERROR_CODE = "marker-errcode-77aa"  # a well-formed token, so only the known-code rule keeps it out
HEADER = "MARKER-HEADER-0c41"
MODEL_TEXT = "MARKER-MODELTEXT-c0d2"
PROMPT = "MARKER-PROMPT-9e1f"
MARKERS = (CREDENTIAL, ERROR_TEXT, ERROR_CODE, HEADER, MODEL_TEXT, PROMPT)
# httpcore's own DEBUG trace prints response headers (never request headers, so never the
# credential); a response header is not a secret under R-DIAG-3, so logs are checked without it.
LOG_MARKERS = tuple(m for m in MARKERS if m != HEADER)

LEAKY = Scripted(
    status=500,
    error_message=f"{ERROR_TEXT} key={CREDENTIAL} said {MODEL_TEXT}",
    error_code=ERROR_CODE,
    headers=(("x-request-id", HEADER),),
)


def _err(status: int, **extra: Any) -> Scripted:
    fields = {
        "status": status,
        "error_message": LEAKY.error_message,
        "error_code": ERROR_CODE,
        "headers": LEAKY.headers,
        **extra,
    }
    return Scripted(**fields)


SCRIPTS: dict[str, list[Scripted]] = {
    # OpenAI wire format
    "chat-a": [
        _err(401),
        _err(429, retry_after="30"),
        _err(503),
        _err(400, error_code="context_length_exceeded"),
        _err(402, error_code="insufficient_quota"),
        Scripted(status=200, raw_body=f'{{"choices": [{{"text": "{MODEL_TEXT}"'.encode()),
        Scripted(text=f"{MODEL_TEXT} truncated", stop_reason="length"),
        Scripted(text=MODEL_TEXT, input_tokens=12, output_tokens=7, cost_usd=0.001),
        Scripted(text=f"{MODEL_TEXT} unsafe", stop_reason="content_filter"),
        Scripted(status=200, text=MODEL_TEXT, cut_body=True),
    ],
    # Anthropic wire format
    "msg-b": [
        _err(529),
        _err(403),
        Scripted(text=MODEL_TEXT, input_tokens=3, output_tokens=4),
        Scripted(text=f"{MODEL_TEXT} refused", stop_reason="refusal"),
        Scripted(text=f"{MODEL_TEXT} max", stop_reason="max_tokens"),
    ],
}


def _catalog(standin: StandIn) -> dict[str, Any]:
    return {
        "providers": {
            "leaky": {
                "credentialEnv": "LEDGER_TEST_KEY",
                "api": "openai-chat",
                "baseUrl": standin.base_url_openai,
            },
            "drippy": {
                "credentialEnv": "LEDGER_TEST_KEY",
                "api": "anthropic-messages",
                "baseUrl": standin.base_url_anthropic,
            },
        },
        "models": [
            {
                "provider": "leaky",
                "id": "chat-a",
                "contextWindow": 100000,
                "maxOutputTokens": 1000,
                "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}],
            },
            {"provider": "drippy", "id": "msg-b", "contextWindow": 100000},
        ],
    }


def _outcome(response: ProviderResponse) -> Outcome:
    """What a worker does with the adapter's raw facts: classify, never read text."""
    if response.exception is not None:
        return Failed(classify_exception(response.exception))
    if response.stop_reason == INVALID_RESPONSE:
        return Failed(classify_kind("invalid_output", "invalid_response"))
    if not response.ok:
        assert response.status is not None
        return Failed(
            classify_http(response.status, response.headers, response.error_body, now_ms())
        )
    stop = classify_stop_reason(response.stop_reason)
    if stop is not None:
        return Failed(
            stop, input_tokens=response.input_tokens, output_tokens=response.output_tokens
        )
    return Success(response.input_tokens, response.output_tokens, response.cost_usd)


@pytest.fixture
def leaky_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, StandIn]]:
    monkeypatch.setenv("LEDGER_TEST_KEY", CREDENTIAL)
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "recovery.json").write_text(
        json.dumps({"callsPerHour": 100, "defaultModel": "leaky/chat-a"})
    )
    with StandIn(SCRIPTS) as standin:
        (home / "catalog.json").write_text(json.dumps(_catalog(standin)))
        yield home, standin


def _drive(led: Ledger, model_key: str, source: str) -> SettleResult:
    model = led.model(model_key)
    prompt = f"{PROMPT} please summarise"
    try:
        res = led.reserve(source, model_key, text=prompt)
    except Refused:
        res = led.reserve(source, model_key, text=prompt, override=True)
    adapter = adapter_for(led.catalog.providers[model.provider], led.env)
    request = CallRequest(
        model_id=model.id,
        messages=(Message("user", prompt),),
        max_tokens=64,
        deadline_ms=res.deadline_ms,
    )
    return led.settle(res.id, _outcome(adapter.call(request, now_ms=now_ms)))


def _cli(home: Path, *args: str) -> str:
    from ledger.cli.main import cli
    result = CliRunner().invoke(cli, ["--home", str(home), *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return str(result.output) + str(result.stderr or "")


def _assert_clean(where: str, data: str | bytes, markers: tuple[str, ...] = MARKERS) -> None:
    blob = data if isinstance(data, bytes) else data.encode("utf-8", "surrogateescape")
    for marker in markers:
        assert marker.encode() not in blob, f"{marker} leaked into {where}"
        assert marker.lower().encode() not in blob.lower(), f"{marker} leaked into {where}"


def test_r_diag_3_nothing_secret_stored_shown_or_logged(
    leaky_home: tuple[Path, StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    home, standin = leaky_home
    caplog.set_level(logging.DEBUG)
    led = Ledger.open(home)
    try:
        results = [_drive(led, "leaky/chat-a", f"src-a{i % 3}") for i in range(10)]
        results += [_drive(led, "drippy/msg-b", f"src-b{i % 2}") for i in range(5)]
    finally:
        led.close()
    # the scripts really ran over HTTP and produced each outcome
    assert len(standin.requests) == 15
    assert all(
        r.headers.get("authorization") or r.headers.get("x-api-key") for r in standin.requests
    )
    kinds = {r.kind for r in results}
    assert kinds >= {"auth", "rate_limit", "transport", "request_rejected", "quota",
                     "invalid_output", "safety"}  # fmt: skip
    assert sum(r.status.value == "succeeded" for r in results) == 2

    outputs = {
        "status": _cli(home, "status"),
        "status --json": _cli(home, "status", "--json"),
        "status --prometheus": _cli(home, "status", "--prometheus"),
        "cooldown list": _cli(home, "cooldown", "list"),
        "cooldown list --json": _cli(home, "cooldown", "list", "--json"),
        "source list --json": _cli(home, "source", "list", "--json"),
    }
    # the status page (issue 22): as a standalone file and as the service renders it
    page_file = home.parent / "status.html"
    outputs["status --html"] = _cli(home, "status", "--html", str(page_file))
    outputs["status --html FILE"] = page_file.read_text()
    from ledger.page import render_page
    from ledger.status.document import build_status

    led = Ledger.open(home)
    try:
        outputs["page served"] = render_page(build_status(led), refresh_url="/")
    finally:
        led.close()
    assert "rate_limit" in outputs["status --html FILE"]
    for source in ("src-a0", "src-a1", "src-a2", "src-b0", "src-b1"):
        outputs[f"source show {source}"] = _cli(home, "source", "show", source)
        outputs[f"source show {source} --json"] = _cli(home, "source", "show", source, "--json")
    # the views are not empty: they show what happened, just nothing secret
    assert "rate_limit" in outputs["status --json"]
    assert "leaky" in outputs["cooldown list"]
    for where, text in outputs.items():
        _assert_clean(where, text)

    files = [p for p in home.rglob("*") if p.is_file() and p.name.startswith("ledger.db")]
    assert any(p.name == "ledger.db" for p in files)
    for path in files:
        _assert_clean(str(path.name), path.read_bytes())

    assert caplog.records  # httpx logged its requests at DEBUG/INFO
    assert any(r.name.startswith("httpcore") for r in caplog.records)  # DEBUG really captured
    _assert_clean("logs", caplog.text, LOG_MARKERS)
    for record in caplog.records:
        _assert_clean("log record", repr(record.__dict__), LOG_MARKERS)


def test_r_diag_3_markers_are_detectable(tmp_path: Path) -> None:
    """The scan itself works: a planted marker is found in file bytes and text."""
    path = tmp_path / "f"
    path.write_bytes(b"x" + ERROR_TEXT.encode() + b"y")
    with pytest.raises(AssertionError):
        _assert_clean("file", path.read_bytes())
    with pytest.raises(AssertionError):
        _assert_clean("text", f"code {ERROR_CODE.upper()}")
    assert os.environ.get("LEDGER_TEST_KEY") != CREDENTIAL  # monkeypatch undid the plant
