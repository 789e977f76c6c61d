"""R-POL-1..7: the error policy table as data, and `decide` with exact numbers on a frozen clock."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.classify import Classification, classify_http, classify_kind
from ledger.kinds import CooldownOrigin, CooldownScope, FailureKind
from ledger.policy_table import (
    FALLBACK_PERMITTED,
    NO_FALLBACK,
    POLICY_TABLE,
    CooldownAction,
    Decision,
    FailureContext,
    FallbackConstraint,
    backoff_ms,
    decide,
    markdown_table,
)

K = FailureKind
F = FallbackConstraint
P = CooldownScope.PROVIDER
M = CooldownScope.MODEL
NOW = 1_700_000_000_000
MODEL = "openai/gpt-x"
SEC = 1_000
MIN = 60 * SEC
HOUR = 60 * MIN


def _no_jitter() -> float:
    return 0.0


def _ctx(c: Classification, **overrides: object) -> FailureContext:
    fields: dict[str, object] = {
        "classification": c,
        "model_key": MODEL,
        "now_ms": NOW,
        "recent_transport_strikes": 0,
        "failures": 0,
        "output_failures": 0,
        "backoff_steps": 0,
        "correction_used": False,
    }
    fields.update(overrides)
    return FailureContext(**fields)  # type: ignore[arg-type]


def _decide(c: Classification, **overrides: object) -> Decision:
    return decide(_ctx(c, **overrides), _no_jitter)


def _http(
    status: int, headers: Mapping[str, str] | None = None, body: bytes = b""
) -> Classification:
    return classify_http(status, headers or {}, body, NOW)


def _cooldown(d: Decision) -> tuple[CooldownScope, str, int, CooldownOrigin] | None:
    if not d.cooldowns:
        return None
    (c,) = d.cooldowns
    assert c.kind is d.kind
    return (c.scope, c.target, c.until_ms - NOW, c.origin)


POL = CooldownOrigin.POLICY
HINT = CooldownOrigin.HINT


# --------------------------------------------------------------------------- one row per table row


@pytest.mark.parametrize(
    ("classification", "cooldown", "backoff", "fallback", "pause"),
    [
        # auth: provider 15 min, other provider
        (_http(401), (P, "openai", 15 * MIN, POL), None, F.OTHER_PROVIDER, None),
        (_http(403), (P, "openai", 15 * MIN, POL), None, F.OTHER_PROVIDER, None),
        # quota: provider 1 h or a later supplied reset
        (_http(402), (P, "openai", HOUR, POL), None, F.OTHER_PROVIDER, None),
        (
            _http(402, {"Retry-After": "7200"}),
            (P, "openai", 2 * HOUR, HINT),
            None,
            F.OTHER_PROVIDER,
            None,
        ),
        (_http(402, {"Retry-After": "60"}), (P, "openai", HOUR, POL), None, F.OTHER_PROVIDER, None),
        (
            _http(429, {}, b'{"error":{"code":"insufficient_quota"}}'),
            (P, "openai", HOUR, POL),
            None,
            F.OTHER_PROVIDER,
            None,
        ),
        # rate limit: model, max(60 s, Retry-After, reset)
        (_http(429), (M, MODEL, 60 * SEC, POL), None, F.OTHER_PROVIDER_OR_SIBLING, None),
        (
            _http(429, {"Retry-After": "120"}),
            (M, MODEL, 120 * SEC, HINT),
            None,
            F.OTHER_PROVIDER_OR_SIBLING,
            None,
        ),
        (
            _http(429, {"Retry-After": "5"}),
            (M, MODEL, 60 * SEC, POL),
            None,
            F.OTHER_PROVIDER_OR_SIBLING,
            None,
        ),
        (
            _http(429, {"Retry-After": "90", "x-ratelimit-reset-tokens": "3m0s"}),
            (M, MODEL, 180 * SEC, HINT),
            None,
            F.OTHER_PROVIDER_OR_SIBLING,
            None,
        ),
        # transport, first on this model: nothing cools, backoff, no fallback
        (_http(503), None, 1 * MIN, None, None),
        # request rejected: model 1 h, compatible window
        (_http(400), (M, MODEL, HOUR, POL), None, F.COMPATIBLE_WINDOW, None),
        (_http(404), (M, MODEL, HOUR, POL), None, F.COMPATIBLE_WINDOW, None),
        (_http(422), (M, MODEL, HOUR, POL), None, F.COMPATIBLE_WINDOW, None),
        (
            _http(400, {}, b'{"error":{"code":"context_length_exceeded"}}'),
            (M, MODEL, HOUR, POL),
            None,
            F.COMPATIBLE_WINDOW,
            None,
        ),
        # invalid output, first: corrective prompt, no cooldown, no fallback
        (classify_kind("invalid_output", "json_schema"), None, None, None, None),
        # safety / write_rejected: pause, never fall back
        (classify_kind("safety"), None, None, None, "safety"),
        (
            classify_kind("write_rejected", "pinned_replaces"),
            None,
            None,
            None,
            "write_rejected:pinned_replaces",
        ),
        # stale and unknown: backoff only
        (classify_kind("stale"), None, 1 * MIN, None, None),
        (_http(418), None, 1 * MIN, None, None),
    ],
)
def test_r_pol_1_table_rows(
    classification: Classification,
    cooldown: tuple[CooldownScope, str, int, CooldownOrigin] | None,
    backoff: int | None,
    fallback: FallbackConstraint | None,
    pause: str | None,
) -> None:
    d = _decide(classification)
    assert _cooldown(d) == cooldown
    assert (d.backoff_until_ms - NOW if d.backoff_until_ms else None) == backoff
    assert d.fallback == fallback
    assert d.pause_reason == pause
    assert d.counts_failure
    assert d.counts_output_failure == (classification.kind is K.INVALID_OUTPUT)
    assert d.transport_strike == (classification.kind is K.TRANSPORT)
    assert d.kind is classification.kind


def test_r_pol_1_quota_later_supplied_reset_wins() -> None:
    c = Classification(K.QUOTA, "http_402", reset_at_ms=NOW + 3 * HOUR)
    assert _cooldown(_decide(c)) == (P, "openai", 3 * HOUR, HINT)


def test_r_pol_1_second_transport_failure_within_window_cools_model() -> None:
    d = _decide(_http(503), recent_transport_strikes=1, backoff_steps=1, failures=1)
    assert _cooldown(d) == (M, MODEL, 1 * MIN, POL)
    assert d.fallback is F.OTHER_PROVIDER
    assert d.backoff_until_ms == NOW + 5 * MIN
    assert d.transport_strike


@pytest.mark.parametrize(
    ("output_failures", "correction_used", "use_correction", "fallback", "pause"),
    [
        (0, False, True, None, None),  # 1st: one corrective prompt on the same model
        (0, True, False, F.ALTERNATE_MODEL, None),  # allowance already spent (persisted)
        (1, True, False, F.ALTERNATE_MODEL, None),  # 2nd: an alternate model
        (1, False, False, F.ALTERNATE_MODEL, None),
        (2, True, False, None, "output_failures"),  # 3rd: pause
    ],
)
def test_r_pol_5_invalid_output_sequence(
    output_failures: int,
    correction_used: bool,
    use_correction: bool,
    fallback: FallbackConstraint | None,
    pause: str | None,
) -> None:
    d = _decide(
        classify_kind("invalid_output", "json_schema"),
        output_failures=output_failures,
        failures=output_failures,
        correction_used=correction_used,
    )
    assert (d.use_correction, d.fallback, d.pause_reason) == (use_correction, fallback, pause)
    assert d.cooldowns == ()
    assert d.backoff_until_ms is None
    assert d.reason == "json_schema"
    assert d.counts_output_failure


@pytest.mark.parametrize(
    "classification",
    [
        _http(401),
        _http(402),
        _http(429),
        _http(503),
        _http(400),
        classify_kind("invalid_output"),
        classify_kind("stale"),
        classify_kind("unknown"),
        classify_kind("safety"),
    ],
)
def test_r_pol_5_failure_cap_pauses_on_the_fifth_failure(classification: Classification) -> None:
    fourth = _decide(classification, failures=3, recent_transport_strikes=1)
    fifth = _decide(classification, failures=4, recent_transport_strikes=1)
    assert fifth.pause_reason in {"failure_cap", "safety"}
    assert fifth.fallback is None
    assert not fifth.use_correction
    if classification.kind is not K.SAFETY:
        assert fourth.pause_reason is None
        assert fifth.pause_reason == "failure_cap"


def test_r_pol_5_five_mixed_failures_pause_the_source() -> None:
    failures = output_failures = steps = 0
    decisions = []
    for c in [_http(401), classify_kind("invalid_output"), _http(503), _http(429), _http(418)]:
        d = _decide(c, failures=failures, output_failures=output_failures, backoff_steps=steps)
        failures += d.counts_failure
        output_failures += d.counts_output_failure
        steps += d.backoff_until_ms is not None
        decisions.append(d.pause_reason)
    assert decisions == [None, None, None, None, "failure_cap"]
    cancelled = _decide(classify_kind("cancelled"), failures=4)
    assert cancelled.pause_reason is None


def test_r_pol_5_cancelled_changes_no_counter() -> None:
    d = _decide(classify_kind("cancelled"), failures=4, output_failures=2, backoff_steps=3)
    assert d == Decision(
        kind=K.CANCELLED,
        subkind="reported",
        reason=None,
        cooldowns=(),
        backoff_until_ms=None,
        pause_reason=None,
        counts_failure=False,
        counts_output_failure=False,
        transport_strike=False,
        use_correction=False,
        fallback=None,
        actions=d.actions,
    )


@pytest.mark.parametrize(
    "classification",
    [
        _http(401),
        _http(429),
        _http(400),
        _http(503),
        classify_kind("invalid_output"),
    ],
)
def test_r_pol_7_side_effects_forbid_fallback_and_correction(
    classification: Classification,
) -> None:
    without = _decide(classification, recent_transport_strikes=1)
    with_effects = _decide(classification, recent_transport_strikes=1, side_effects=True)
    assert without.fallback is not None or without.use_correction
    assert with_effects.fallback is None
    assert not with_effects.use_correction
    assert with_effects.cooldowns == without.cooldowns


@pytest.mark.parametrize(
    "classification", [_http(401), _http(429), _http(400), classify_kind("invalid_output", "json")]
)
def test_r_pol_4_a_follow_ups_failure_permits_no_immediate_follow_up(
    classification: Classification,
) -> None:
    plain = _decide(classification)
    follow = _decide(classification, was_follow_up=True)
    assert plain.fallback is not None or plain.use_correction
    assert follow.fallback is None
    assert FALLBACK_PERMITTED not in " ".join(follow.actions)
    assert NO_FALLBACK in follow.actions
    # a granted correction stays owed to the next queue item (persisted), just not immediately
    assert follow.use_correction == plain.use_correction
    assert follow.cooldowns == plain.cooldowns


@pytest.mark.parametrize(
    "classification", [_http(401), _http(402), _http(429), _http(400), classify_kind("stale")]
)
def test_r_pol_6_route_failures_leave_source_retry_time(classification: Classification) -> None:
    if classification.kind is K.STALE:
        assert _decide(classification).backoff_until_ms is not None
    else:
        assert _decide(classification).backoff_until_ms is None


def test_r_pol_2_cooldown_is_never_reported_shortened() -> None:
    existing = {(M, MODEL): NOW + 2 * HOUR}
    d = _decide(_http(429), existing_cooldowns=existing)
    assert d.cooldowns == (
        CooldownAction(M, MODEL, NOW + 60 * SEC, K.RATE_LIMIT, CooldownOrigin.POLICY),
    )
    assert any("kept (longer existing" in line for line in d.actions)
    assert not any("kept" in line for line in _decide(_http(429)).actions)


def test_r_pol_2_model_cooldown_targets_only_that_model() -> None:
    d = _decide(_http(429), model_key="openrouter/meta/llama-3")
    assert [(c.scope, c.target) for c in d.cooldowns] == [(M, "openrouter/meta/llama-3")]
    d = _decide(_http(401), model_key="openrouter/meta/llama-3")
    assert [(c.scope, c.target) for c in d.cooldowns] == [(P, "openrouter")]


# --------------------------------------------------------------------------- backoff (R-POL-3)


@pytest.mark.parametrize(
    ("step", "base"),
    [
        (0, 60 * SEC),
        (1, 300 * SEC),
        (2, 900 * SEC),
        (3, 3600 * SEC),
        (4, 3600 * SEC),
        (50, 3600 * SEC),
    ],
)
def test_r_pol_3_backoff_steps(step: int, base: int) -> None:
    assert backoff_ms(step, _no_jitter) == base
    assert backoff_ms(step, lambda: 0.5) == base + base // 10
    assert base < backoff_ms(step, lambda: 0.999999) <= base * 6 // 5


def test_r_pol_3_backoff_uses_source_steps() -> None:
    got = [_decide(_http(503), backoff_steps=n, failures=0).backoff_until_ms for n in range(5)]
    assert [g - NOW for g in got if g is not None] == [60 * SEC, 300 * SEC, 900 * SEC, HOUR, HOUR]


@given(st.integers(-5, 100), st.floats(allow_nan=True, allow_infinity=True))
def test_r_pol_3_backoff_within_bounds(step: int, jitter: float) -> None:
    base = (60 * SEC, 300 * SEC, 900 * SEC, HOUR)[min(max(step, 0), 3)]
    assert base <= backoff_ms(step, lambda: jitter) <= base * 6 // 5


# --------------------------------------------------------------------------- properties

_kinds = st.sampled_from(list(FailureKind))
_hints = st.one_of(st.none(), st.integers(-(10**13), 10**13))


@st.composite
def _contexts(draw: st.DrawFn) -> FailureContext:
    kind = draw(_kinds)
    c = Classification(
        kind,
        "reported",
        retry_after_ms=draw(_hints),
        reset_at_ms=draw(_hints),
        reason=draw(st.none() | st.sampled_from(["json_schema", "pinned_replaces"])),
    )
    return FailureContext(
        classification=c,
        model_key=draw(st.sampled_from([MODEL, "anthropic/claude", "a/b/c"])),
        now_ms=draw(st.integers(0, 4 * 10**12)),
        recent_transport_strikes=draw(st.integers(0, 5)),
        failures=draw(st.integers(0, 10)),
        output_failures=draw(st.integers(0, 4)),
        backoff_steps=draw(st.integers(0, 10)),
        correction_used=draw(st.booleans()),
        side_effects=draw(st.booleans()),
    )


@given(_contexts(), st.floats(0, 0.999999))
def test_r_pol_invariants(ctx: FailureContext, jitter: float) -> None:
    d = decide(ctx, lambda: jitter)
    for cooldown in d.cooldowns:
        assert cooldown.until_ms > ctx.now_ms
        assert cooldown.until_ms <= ctx.now_ms + 7 * 24 * HOUR
    if d.backoff_until_ms is not None:
        assert ctx.now_ms + MIN <= d.backoff_until_ms <= ctx.now_ms + HOUR * 6 // 5
    if d.pause_reason is not None or ctx.side_effects:
        assert d.fallback is None
        assert not d.use_correction
    if d.kind in {K.SAFETY, K.WRITE_REJECTED, K.STALE, K.CANCELLED, K.UNKNOWN}:
        assert d.fallback is None
    assert d.counts_failure == (d.kind is not K.CANCELLED)
    if d.counts_failure and ctx.failures + 1 >= 5:
        assert d.pause_reason is not None
    assert not (d.use_correction and d.fallback)


# --------------------------------------------------------------------------- docs


def test_r_pol_1_markdown_table_mentions_every_kind() -> None:
    table = markdown_table()
    for kind in FailureKind:
        assert f"| `{kind}` |" in table
    assert set(POLICY_TABLE) == set(FailureKind)
    assert table.count("\n") == len(FailureKind) + 2
