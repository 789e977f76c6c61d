"""R-POL-11, R-HTTP-2a (issue 24 items 2 and 3): safety codes on a 4xx pause and never fall back;
known phrases choose their row; absurd Retry-After hints are capped. Over real HTTP via the
stand-in, each with its provider's documented error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.classify import KNOWN_PHRASES, MAX_BODY_BYTES, MAX_HINT_MS, classify_http
from ledger.kinds import FailureKind
from ledger.standin.server import Scripted, StandIn
from ledger.store.views import cooldown_list
from ledger.worker.queue import ItemOutcome
from tests.support.queue_setup import db_rows, one_item, open_ledger, roles, standin_home

NOW = 1_700_000_000_000
MARKER = "PROSE-MARKER-7f3a"  # provider prose: must never reach the database


def _stored(home: Path) -> bytes:
    """Every byte the ledger wrote to its state directory (database, journal, WAL)."""
    return b"".join(p.read_bytes() for p in sorted(home.glob("ledger.db*")))


def _doc(document: object) -> bytes:
    return json.dumps(document).encode()


# Each provider's documented shape (OpenAI "Error codes"; Azure OpenAI "Content filtering";
# Gemini "GenerateContentResponse": promptFeedback.blockReason, Candidate.finishReason).
OPENAI_POLICY = _doc({"error": {"message": MARKER, "type": "invalid_request_error", "param": None,
                                "code": "content_policy_violation"}})
AZURE_FILTER = _doc({"error": {
    "message": MARKER, "type": None, "param": "prompt", "code": "content_filter", "status": 400,
    "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": {
        "hate": {"filtered": True, "severity": "high"},
        "self_harm": {"filtered": False, "severity": "safe"}}}}})
AZURE_INNER_ONLY = _doc({"error": {"message": MARKER, "code": "invalid_prompt", "status": 400,
                                   "innererror": {"code": "ResponsibleAIPolicyViolation"}}})


def _gemini_prompt_block(reason: str) -> bytes:
    return _doc({"promptFeedback": {"blockReason": reason, "safetyRatings": [
        {"category": "HARM_CATEGORY_HARASSMENT", "probability": "HIGH", "blocked": True}]},
        "usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8}})


def _gemini_candidate_block(reason: str) -> bytes:
    return _doc({"candidates": [{"finishReason": reason, "index": 0, "safetyRatings": []}],
                 "usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8}})


SAFETY_SHAPES = [
    ("openai-content-policy-400", 400, OPENAI_POLICY, "safety:content_policy_violation"),
    ("azure-content-filter-400", 400, AZURE_FILTER, "safety:content_policy_violation"),
    ("azure-innererror-400", 400, AZURE_INNER_ONLY, "safety:responsibleaipolicyviolation"),
    ("gemini-prompt-safety-400", 400, _gemini_prompt_block("SAFETY"), "safety:safety"),
    ("gemini-prompt-prohibited-400", 400, _gemini_prompt_block("PROHIBITED_CONTENT"),
     "safety:prohibited_content"),
    ("gemini-finish-spii-400", 400, _gemini_candidate_block("SPII"), "safety:spii"),
    ("gemini-finish-blocklist-403", 403, _gemini_candidate_block("BLOCKLIST"), "safety:blocklist"),
    # a Gemini reply passed through an OpenAI-compatible proxy as a 200: a stop reason
    ("gemini-prompt-block-200", 200, _gemini_prompt_block("PROHIBITED_CONTENT"),
     "safety:prohibited_content"),
    ("gemini-finish-safety-200", 200, _gemini_candidate_block("SAFETY"), "safety:safety"),
]  # fmt: skip
# the Azure body carries content_filter in error.code: that code names the pause
SAFETY_SHAPES[1] = (*SAFETY_SHAPES[1][:3], "safety:content_filter")


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn(default=Scripted(text='{"ok": true}')) as server:
        yield server


@pytest.mark.parametrize(
    ("shape", "status", "body", "pause"), SAFETY_SHAPES, ids=[s[0] for s in SAFETY_SHAPES]
)
def test_r_pol_11_safety_code_pauses_and_never_falls_back(
    tmp_path: Path, standin: StandIn, shape: str, status: int, body: bytes, pause: str
) -> None:
    led = open_ledger(standin_home(tmp_path / "h", standin))
    try:
        standin.set_script("m1", [Scripted(status=status, raw_body=body)])
        report = one_item(led, "s")
        assert roles(report) == [("p1/m1", "primary", "safety")]  # no second attempt anywhere
        assert report.outcome is ItemOutcome.PAUSED
        assert [r.model for r in standin.requests] == ["m1"]
        assert db_rows(led.state.path, "SELECT state, pause_reason FROM sources") == [
            ("paused", pause)
        ]
        assert cooldown_list(led.db)[1] == []  # a guard is not provider health
        assert MARKER.encode() not in _stored(led.state.path)
    finally:
        led.close()


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [(500, OPENAI_POLICY, "transport"),
     (200, _doc({"candidates": [{"finishReason": "SAFETY",
                                 "content": {"parts": [{"text": "x"}]}}]}), "invalid_output")],
    ids=["5xx", "candidate-with-content"],
)  # fmt: skip
def test_r_pol_11_safety_codes_only_on_a_4xx_or_a_block(
    tmp_path: Path, standin: StandIn, status: int, body: bytes, kind: str
) -> None:
    # a 5xx stays transport; a candidate with content is no block (an invalid chat reply)
    led = open_ledger(standin_home(tmp_path / "h", standin))
    try:
        standin.set_script("m1", [Scripted(status=status, raw_body=body)])
        report = one_item(led, "s")
        assert report.attempts[0].kind == kind  # each case its own kind, never `safety`
        assert report.outcome is not ItemOutcome.PAUSED
    finally:
        led.close()


CREDIT_MESSAGE = (
    "Your credit balance is too low to access the Anthropic API. "
    "Please go to Plans & Billing to upgrade or purchase credits."
)


def test_r_http_2a_anthropic_credit_balance_400_is_quota_on_the_provider(
    tmp_path: Path, standin: StandIn
) -> None:
    led = open_ledger(standin_home(tmp_path / "h", standin, defaultModel="p2/m2"))
    try:
        standin.set_script("m2", [Scripted(status=400, error_message=CREDIT_MESSAGE)])
        report = one_item(led, "s")
        # the provider cools (not one model whose siblings fail the same way); another serves
        assert roles(report)[0] == ("p2/m2", "primary", "quota")
        assert report.outcome is ItemOutcome.DONE
        ((scope, target, kind),) = [
            (c.scope.value, c.target, c.kind) for c in cooldown_list(led.db)[1]
        ]
        assert (scope, target, kind) == ("provider", "p2", "quota")
        assert db_rows(led.state.path, "SELECT subkind FROM reservations WHERE id = 1") == [
            ("credit_balance_too_low",)
        ]
        assert b"credit balance" not in _stored(led.state.path)  # the body was dropped
    finally:
        led.close()


def _anthropic_400(message: str) -> bytes:
    return _doc({"type": "error", "error": {"type": "invalid_request_error", "message": message}})


@pytest.mark.parametrize("entry", KNOWN_PHRASES, ids=[p.subkind for p in KNOWN_PHRASES])
def test_r_http_2a_every_phrase_entry_chooses_its_row(entry: object) -> None:
    from ledger.classify import KnownPhrase

    assert isinstance(entry, KnownPhrase)
    assert entry.provider == "anthropic"  # each entry names its provider
    (status,) = entry.statuses
    body = _anthropic_400(f"Note: {entry.phrase.upper()} for this account.")  # any case
    got = classify_http(status, {}, body, NOW)
    assert (got.kind, got.subkind) == (entry.kind, entry.subkind)
    # the phrase beyond the bounded body, on another status or without the code: no match
    far = _anthropic_400("x" * MAX_BODY_BYTES + entry.phrase)
    assert classify_http(status, {}, far, NOW).kind is FailureKind.REQUEST_REJECTED
    assert classify_http(404, {}, body, NOW).subkind != entry.subkind
    # the same words in another provider's shape (OpenAI's envelope) are not this entry
    other = _doc({"error": {"message": entry.phrase, "type": "invalid_request_error"}})
    assert classify_http(status, {}, other, NOW).kind is FailureKind.REQUEST_REJECTED


@pytest.mark.parametrize("value", ["99999999999999999999", "inf", "Infinity", "9" * 64])
def test_issue24_item3_absurd_retry_after_is_capped_at_the_horizon(
    tmp_path: Path, standin: StandIn, value: str
) -> None:
    assert classify_http(429, {"Retry-After": value}, None, NOW).retry_after_ms == MAX_HINT_MS
    led = open_ledger(standin_home(tmp_path / "h", standin))
    try:
        standin.set_script("m1", [Scripted(status=429, retry_after=value)])
        one_item(led, "s")
        now, rows = cooldown_list(led.db)
        (cooldown,) = [c for c in rows if c.target == "p1/m1"]
        assert cooldown.origin.value == "hint"
        assert MAX_HINT_MS - 60_000 < cooldown.until_ms - now <= MAX_HINT_MS
    finally:
        led.close()
