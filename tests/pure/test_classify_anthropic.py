"""Issue 13 item 3: Anthropic spend limits are quota, and Anthropic's truncating/pausing stops."""

from __future__ import annotations

import json

import pytest

from ledger.classify import classify_http, classify_stop_reason
from ledger.kinds import CooldownScope
from ledger.kinds import FailureKind as K
from ledger.policy_table import FailureContext, decide

NOW = 1_700_000_000_000
HOUR_MS = 3_600_000


def _spend_limit_body(code: str) -> bytes:
    """The shape of Anthropic's spend-limit 429 (error.details.error_code)."""
    return json.dumps(
        {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "message": "scripted error",
                "details": {"error_code": code},
            },
        }
    ).encode()


@pytest.mark.parametrize(
    "code", ["enforced_spend_limit_reached", "contract_spend_limit_reached", "ramp_limit_exceeded"]
)
def test_issue13_item3_spend_limit_429_is_quota(code: str) -> None:
    got = classify_http(429, {"retry-after": "30"}, _spend_limit_body(code), NOW)
    assert (got.kind, got.subkind) == (K.QUOTA, code)


def test_issue13_item3_spend_limit_cools_the_provider_until_reset() -> None:
    reset = "2023-11-15T04:00:00Z"  # about 5 h 47 min after NOW
    got = classify_http(
        429,
        {"anthropic-ratelimit-requests-reset": reset},
        _spend_limit_body("enforced_spend_limit_reached"),
        NOW,
    )
    ctx = FailureContext(
        classification=got,
        model_key="anthropic/claude-x",
        now_ms=NOW,
        recent_transport_strikes=0,
        failures=0,
        output_failures=0,
        backoff_steps=0,
        correction_used=False,
    )
    (cooldown,) = decide(ctx, lambda: 0.0).cooldowns
    assert cooldown.scope is CooldownScope.PROVIDER
    assert cooldown.target == "anthropic"
    assert cooldown.until_ms == 1_700_020_800_000
    assert cooldown.until_ms - NOW > HOUR_MS


def test_issue13_item3_plain_anthropic_429_stays_rate_limit() -> None:
    body = json.dumps({"type": "error", "error": {"type": "rate_limit_error"}}).encode()
    assert classify_http(429, {}, body, NOW).kind is K.RATE_LIMIT


@pytest.mark.parametrize(
    ("stop", "subkind"),
    [("model_context_window_exceeded", "length_stop"), ("pause_turn", "incomplete_stop")],
)
def test_issue13_item3_truncated_or_paused_reply_is_invalid_output(stop: str, subkind: str) -> None:
    got = classify_stop_reason(stop)
    assert got is not None
    assert (got.kind, got.subkind) == (K.INVALID_OUTPUT, subkind)
