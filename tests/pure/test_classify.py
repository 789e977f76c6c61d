"""SPEC section 8 triggers and R-HTTP-2: classification from status, known codes, hints, types."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.classify import (
    KNOWN_ERROR_CODES,
    MAX_BODY_BYTES,
    MAX_HINT_MS,
    Classification,
    classify_exception,
    classify_http,
    classify_kind,
    classify_stop_reason,
    parse_retry_after,
)
from ledger.errors import UsageError
from ledger.kinds import FailureKind as K

NOW = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def _body(obj: object) -> bytes:
    return json.dumps(obj).encode()


# --------------------------------------------------------------------------- HTTP triggers


@pytest.mark.parametrize(
    ("status", "body", "kind", "subkind"),
    [
        # auth
        (401, None, K.AUTH, "http_401"),
        (403, None, K.AUTH, "http_403"),
        (401, _body({"error": {"code": "invalid_api_key"}}), K.AUTH, "http_401"),
        # quota: 402, or a known quota/billing code on any status
        (402, None, K.QUOTA, "http_402"),
        (429, _body({"error": {"code": "insufficient_quota"}}), K.QUOTA, "insufficient_quota"),
        (429, _body({"error": {"type": "insufficient_quota"}}), K.QUOTA, "insufficient_quota"),
        (
            400,
            _body({"error": {"code": "billing_hard_limit_reached"}}),
            K.QUOTA,
            "billing_hard_limit_reached",
        ),
        (403, _body({"error": {"code": "billing_not_active"}}), K.QUOTA, "billing_not_active"),
        (
            400,
            _body({"type": "error", "error": {"type": "credit_balance_too_low"}}),
            K.QUOTA,
            "credit_balance_too_low",
        ),
        (
            402,
            _body({"type": "error", "error": {"type": "billing_error"}}),
            K.QUOTA,
            "billing_error",
        ),
        (500, _body({"code": "insufficient_quota"}), K.QUOTA, "insufficient_quota"),
        # rate limit: 429 without a quota code
        (429, None, K.RATE_LIMIT, "http_429"),
        (
            429,
            _body({"error": {"code": "rate_limit_exceeded"}}),
            K.RATE_LIMIT,
            "rate_limit_exceeded",
        ),
        (
            429,
            _body({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}),
            K.RATE_LIMIT,
            "resource_exhausted",
        ),
        (
            429,
            _body([{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}]),
            K.RATE_LIMIT,
            "resource_exhausted",
        ),
        # transport: 408 and 5xx, Anthropic 529 included
        (408, None, K.TRANSPORT, "http_408"),
        (500, None, K.TRANSPORT, "http_500"),
        (502, None, K.TRANSPORT, "http_502"),
        (503, None, K.TRANSPORT, "http_503"),
        (
            529,
            _body({"type": "error", "error": {"type": "overloaded_error"}}),
            K.TRANSPORT,
            "overloaded_error",
        ),
        # request rejected: 400/404/422 and context overflow codes
        (400, None, K.REQUEST_REJECTED, "http_400"),
        (404, None, K.REQUEST_REJECTED, "http_404"),
        (422, None, K.REQUEST_REJECTED, "http_422"),
        (
            400,
            _body({"error": {"code": "context_length_exceeded"}}),
            K.REQUEST_REJECTED,
            "context_overflow",
        ),
        (
            400,
            _body({"error": {"type": "invalid_request_error", "code": "context_length_exceeded"}}),
            K.REQUEST_REJECTED,
            "context_overflow",
        ),
        (
            413,
            _body({"error": {"code": "model_context_window_exceeded"}}),
            K.REQUEST_REJECTED,
            "context_overflow",
        ),
        (
            413,
            _body({"type": "error", "error": {"type": "request_too_large"}}),
            K.REQUEST_REJECTED,
            "request_too_large",
        ),
        # anything else
        (418, None, K.UNKNOWN, "http_418"),
        (409, _body({"error": {"code": "something_new"}}), K.UNKNOWN, "http_409"),
        (200, None, K.UNKNOWN, "http_200"),
        (0, None, K.UNKNOWN, "http_invalid"),
        (-1, None, K.UNKNOWN, "http_invalid"),
    ],
)
def test_section_8_http_triggers(status: int, body: bytes | None, kind: K, subkind: str) -> None:
    got = classify_http(status, {}, body, NOW)
    assert (got.kind, got.subkind) == (kind, subkind)
    assert got.reason is None


def test_r_http_2_codes_are_read_only_from_well_known_fields() -> None:
    # A quota word inside free text or an unrelated field must not make a 429 a quota failure.
    prose = _body({"error": {"message": "insufficient_quota", "param": "insufficient_quota"}})
    assert classify_http(429, {}, prose, NOW).kind is K.RATE_LIMIT
    assert classify_http(429, {}, b"insufficient_quota", NOW).kind is K.RATE_LIMIT
    assert classify_http(429, {}, _body("insufficient_quota"), NOW).kind is K.RATE_LIMIT


def test_r_http_2_body_beyond_8192_bytes_is_not_read() -> None:
    code = _body({"error": {"code": "insufficient_quota"}})
    padded = b'{"pad": "' + b"x" * MAX_BODY_BYTES + b'", ' + code[1:]
    assert classify_http(429, {}, padded, NOW).kind is K.RATE_LIMIT
    assert classify_http(429, {}, code, NOW).kind is K.QUOTA


# --------------------------------------------------------------------------- hint headers


@pytest.mark.parametrize(
    ("headers", "retry_after_ms", "reset_at_ms"),
    [
        ({"Retry-After": "120"}, 120_000, None),
        ({"retry-after": "5"}, 5_000, None),
        ({"RETRY-AFTER": "1.5"}, 1_500, None),
        ({"Retry-After": "0"}, 0, None),
        ({"Retry-After": "Tue, 14 Nov 2023 22:15:20 GMT"}, 120_000, None),
        ({"retry-after-ms": "2500", "Retry-After": "3"}, 3_000, None),  # issue 12 item 7: longest
        ({"retry-after-ms": "junk", "Retry-After": "3"}, 3_000, None),
        ({"Retry-After": "-5"}, None, None),
        ({"Retry-After": "604801"}, MAX_HINT_MS, None),  # issue 12 item 7: capped, not dropped
        ({"Retry-After": "1e3"}, None, None),
        ({"Retry-After": "120 seconds"}, None, None),
        ({"Retry-After": "Wed, 14 Nov 2023 22:15:20 GMT"}, None, None),  # wrong weekday
        ({"Retry-After": "Tue, 14 Nov 2023 22:10:20 GMT"}, 0, None),  # in the past: no delay
        ({"Retry-After": "10", "retry-after": "20"}, None, None),  # ambiguous duplicate
        ({"x-ratelimit-reset-requests": "6m0s"}, None, NOW + 360_000),
        ({"x-ratelimit-reset-tokens": "1.5s"}, None, NOW + 1_500),
        ({"x-ratelimit-reset-tokens": "250ms"}, None, NOW + 250),
        ({"x-ratelimit-reset-tokens": "1h2m3s"}, None, NOW + 3_723_000),
        ({"x-ratelimit-reset-tokens": "soon"}, None, None),
        ({"x-ratelimit-reset-tokens": "-1s"}, None, None),
        ({"x-ratelimit-reset-tokens": "999999h"}, None, NOW + MAX_HINT_MS),
        # exhausted family preferred; otherwise the latest reset
        (
            {
                "x-ratelimit-reset-requests": "1m0s",
                "x-ratelimit-reset-tokens": "2s",
                "x-ratelimit-remaining-tokens": "0",
                "x-ratelimit-remaining-requests": "10",
            },
            None,
            NOW + 2_000,
        ),
        (
            {"x-ratelimit-reset-requests": "1m0s", "x-ratelimit-reset-tokens": "2s"},
            None,
            NOW + 60_000,
        ),
        ({"anthropic-ratelimit-tokens-reset": "2023-11-14T22:14:20Z"}, None, NOW + 60_000),
        (
            {"anthropic-ratelimit-requests-reset": "2023-11-14T23:14:20.500+01:00"},
            None,
            NOW + 60_500,
        ),
        ({"anthropic-ratelimit-tokens-reset": "2023-11-14T22:00:00Z"}, None, None),  # past
        ({"anthropic-ratelimit-tokens-reset": "2031-01-01T00:00:00Z"}, None, NOW + MAX_HINT_MS),
        ({"anthropic-ratelimit-tokens-reset": "2023-11-14 22:14:20"}, None, None),
        ({"anthropic-ratelimit-tokens-reset": "2023-13-40T22:14:20Z"}, None, None),
    ],
)
def test_section_8_hint_headers(
    headers: Mapping[str, str], retry_after_ms: int | None, reset_at_ms: int | None
) -> None:
    got = classify_http(429, headers, None, NOW)
    assert (got.retry_after_ms, got.reset_at_ms) == (retry_after_ms, reset_at_ms)


def test_section_8_httpx_headers_are_accepted() -> None:
    headers = httpx.Headers({"Retry-After": "120"})
    assert classify_http(429, headers, None, NOW).retry_after_ms == 120_000


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("120", 120_000),
        (" 7 ", 7_000),
        ("0.25", 250),
        ("604800", 604_800_000),
        ("Tue, 14 Nov 2023 22:13:21 GMT", 1_000),
        ("", None),
        ("-1", None),
        ("604801", 604_800_000),  # issue 12 item 7: the horizon, never dropped
        ("99999999999999999999", 604_800_000),  # issue 24 item 3: capped, not ignored
        ("NaN", None),
        ("inf", 604_800_000),  # issue 24 item 3
        ("\uff11\uff12", None),  # fullwidth digits
        ("Tuesday, 14-Nov-23 22:13:21 GMT", 1_000),  # RFC 850
        ("Tue Nov 14 22:13:21 2023", 1_000),  # asctime
        ("Tue, 31 Feb 2023 22:13:21 GMT", None),
    ],
)
def test_section_8_parse_retry_after(value: str, ms: int | None) -> None:
    assert parse_retry_after(value, NOW) == ms


# --------------------------------------------------------------------------- stop reasons


@pytest.mark.parametrize(
    ("stop", "kind", "subkind"),
    [
        ("length", K.INVALID_OUTPUT, "length_stop"),
        ("max_tokens", K.INVALID_OUTPUT, "length_stop"),
        ("MAX_TOKENS", K.INVALID_OUTPUT, "length_stop"),
        ("context_length_exceeded", K.REQUEST_REJECTED, "context_overflow"),
        ("context_limit", K.REQUEST_REJECTED, "context_overflow"),
        ("content_filter", K.SAFETY, "content_filter_stop"),
        ("refusal", K.SAFETY, "refusal_stop"),
        ("SAFETY", K.SAFETY, "safety_stop"),
        ("something_new", K.UNKNOWN, "unrecognised_stop"),
        ("x" * 5000, K.UNKNOWN, "unrecognised_stop"),
    ],
)
def test_section_8_stop_reasons(stop: str, kind: K, subkind: str) -> None:
    got = classify_stop_reason(stop)
    assert got is not None
    assert (got.kind, got.subkind) == (kind, subkind)


@pytest.mark.parametrize(
    "stop", [None, "stop", "end_turn", "tool_use", "tool_calls", "stop_sequence", "STOP"]
)
def test_section_8_normal_stops_are_not_failures(stop: str | None) -> None:
    assert classify_stop_reason(stop) is None


# --------------------------------------------------------------------------- exceptions


@pytest.mark.parametrize(
    ("exc", "kind", "subkind"),
    [
        (httpx.ReadTimeout("secret"), K.TRANSPORT, "timeout"),
        (httpx.ConnectTimeout("secret"), K.TRANSPORT, "timeout"),
        (httpx.PoolTimeout("secret"), K.TRANSPORT, "timeout"),
        (TimeoutError("secret"), K.TRANSPORT, "timeout"),
        (httpx.ConnectError("secret"), K.TRANSPORT, "connect_error"),
        (httpx.RemoteProtocolError("secret"), K.TRANSPORT, "protocol_error"),
        (httpx.ReadError("secret"), K.TRANSPORT, "stream_cut"),
        (httpx.WriteError("secret"), K.TRANSPORT, "write_error"),
        (httpx.CloseError("secret"), K.TRANSPORT, "network_error"),
        (ConnectionResetError("secret"), K.TRANSPORT, "network_error"),
        (asyncio.CancelledError("secret"), K.CANCELLED, "cancelled"),
        (KeyboardInterrupt("secret"), K.CANCELLED, "interrupted"),
        (SystemExit("secret"), K.CANCELLED, "shutdown"),
        (ValueError("secret"), K.UNKNOWN, "exception"),
        (RuntimeError("secret"), K.UNKNOWN, "exception"),
        (httpx.UnsupportedProtocol("secret"), K.UNKNOWN, "exception"),
    ],
)
def test_section_8_exceptions_by_type_only(exc: BaseException, kind: K, subkind: str) -> None:
    got = classify_exception(exc)
    assert (got.kind, got.subkind) == (kind, subkind)
    assert "secret" not in repr(got)


# --------------------------------------------------------------------------- explicit outcomes


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("invalid_output", "json_schema"),
        (K.INVALID_OUTPUT, None),
        ("safety", None),
        ("write_rejected", "pinned_replaces"),
        ("stale", None),
        ("cancelled", None),
    ],
)
def test_section_8_explicit_outcomes(kind: str, reason: str | None) -> None:
    got = classify_kind(kind, reason)
    assert (got.kind, got.reason) == (K(kind), reason)


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("nope", None),
        ("", None),
        ("invalid_output", "Has Spaces"),
        ("invalid_output", ""),
        ("invalid_output", "x" * 65),
        ("write_rejected", "sk-live-secret!"),
    ],
)
def test_section_8_explicit_outcome_rejects_bad_input(kind: str, reason: str | None) -> None:
    with pytest.raises(UsageError) as info:
        classify_kind(kind, reason)
    assert info.value.message in {
        "unknown failure kind; see `ledger settle --help`",
        "a failure reason must match [a-z0-9_.-]{1,64}",
    }


def test_r_http_2_classification_refuses_free_text() -> None:
    with pytest.raises(UsageError):
        Classification(K.UNKNOWN, "Provider said: you are out of credit")


# --------------------------------------------------------------------------- properties

_HTTP_SUBKINDS = {f"http_{n}" for n in range(100, 600)} | {"http_invalid"}
_ALLOWED_SUBKINDS = _HTTP_SUBKINDS | set(KNOWN_ERROR_CODES) | {"context_overflow"}
_MARK = "zq9MARKzq9"

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_code_values = st.sampled_from(sorted(KNOWN_ERROR_CODES)) | st.text(max_size=10)


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return draw(st.binary(max_size=512)) + _MARK.encode()
    if choice == 1:
        return b"\xff\xfe" + _MARK.encode() + draw(st.binary(max_size=64))
    if choice == 2:
        depth = draw(st.integers(1, 50_000))
        return b'{"error":' * depth + b'"' + _MARK.encode() + b'"' + b"}" * depth
    if choice == 3:
        return b"[" * draw(st.integers(1, 100_000)) + _MARK.encode()
    if choice == 4:
        big = draw(st.integers(8_000, 200_000))
        return _body({"error": {"code": _MARK, "message": "x" * big}})
    error = {
        "code": draw(_code_values),
        "type": draw(_code_values),
        "status": draw(_code_values),
        "message": _MARK + draw(st.text(max_size=30)),
        "extra": draw(_json),
    }
    return _body(draw(st.sampled_from([{"error": error}, [{"error": error}], error, [error]])))


_header_values = (
    st.integers(-(10**12), 10**12).map(str)
    | st.floats(allow_nan=True).map(str)
    | st.text(max_size=40)
    | st.just(_MARK)
)
_header_names = st.sampled_from(
    [
        "Retry-After",
        "retry-after-ms",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-remaining",
        "X-Other",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    status=st.integers(-1000, 2000),
    headers=st.dictionaries(_header_names, _header_values, max_size=6),
    body=_bodies() | st.none(),
)
def test_r_http_2_garbage_never_raises_nor_leaks(
    status: int, headers: dict[str, str], body: bytes | None
) -> None:
    got = classify_http(status, headers, body, NOW)
    assert _MARK.lower() not in repr(got).lower()
    assert got.subkind in _ALLOWED_SUBKINDS
    assert got.reason is None or got.reason in KNOWN_ERROR_CODES  # a fixed token, never prose
    if got.retry_after_ms is not None:
        assert 0 <= got.retry_after_ms <= 7 * 24 * 3600 * 1000
    if got.reset_at_ms is not None:
        assert NOW <= got.reset_at_ms <= NOW + 7 * 24 * 3600 * 1000


@given(st.text(max_size=80))
def test_section_8_parse_retry_after_total(value: str) -> None:
    got = parse_retry_after(value, NOW)
    assert got is None or 0 <= got <= 7 * 24 * 3600 * 1000


_STOP_SUBKINDS = {
    "length_stop",
    "context_overflow",
    "unrecognised_stop",
    "content_filter_stop",
    "refusal_stop",
    "safety_stop",
    "recitation_stop",
    "blocklist_stop",
    "prohibited_content_stop",
    "spii_stop",
}


@given(st.text(max_size=80) | st.none())
def test_section_8_stop_reason_total(stop: str | None) -> None:
    got = classify_stop_reason(stop)
    assert got is None or got.subkind in _STOP_SUBKINDS


# --------------------------------------------------------------------------- issue 12


@pytest.mark.parametrize(
    ("status", "body", "kind", "subkind"),
    [
        (409, _body({"error": {"code": "rate_limit_exceeded"}}), K.UNKNOWN, "http_409"),
        (418, _body({"error": {"code": "invalid_api_key"}}), K.UNKNOWN, "http_418"),
        (200, _body({"error": {"code": "server_error"}}), K.UNKNOWN, "http_200"),
        (302, _body({"error": {"type": "overloaded_error"}}), K.UNKNOWN, "http_302"),
        (413, None, K.REQUEST_REJECTED, "http_413"),
        (500, _body({"error": {"code": "context_length_exceeded"}}), K.TRANSPORT, "http_500"),
        (400, _body({"error": {"code": "rate_limit_exceeded"}}), K.REQUEST_REJECTED, "http_400"),
        # quota/billing codes are the one exception: they apply on any status
        (409, _body({"error": {"code": "insufficient_quota"}}), K.QUOTA, "insufficient_quota"),
        (200, _body({"error": {"type": "billing_error"}}), K.QUOTA, "billing_error"),
    ],
)
def test_issue12_item8_only_quota_codes_apply_off_the_status_row(
    status: int, body: bytes | None, kind: K, subkind: str
) -> None:
    got = classify_http(status, {}, body, NOW)
    assert (got.kind, got.subkind) == (kind, subkind)


@pytest.mark.parametrize("value", ["604801", "99999999", "Tue, 14 Nov 2034 22:13:20 GMT"])
def test_issue12_item7_retry_after_beyond_the_horizon_is_the_horizon(value: str) -> None:
    assert parse_retry_after(value, NOW) == MAX_HINT_MS
    assert classify_http(429, {"Retry-After": value}, None, NOW).retry_after_ms == MAX_HINT_MS


@pytest.mark.parametrize(
    ("headers", "ms"),
    [
        ({"retry-after-ms": "2500", "retry-after": "30"}, 30_000),
        ({"retry-after-ms": "45000", "retry-after": "30"}, 45_000),
        ({"retry-after-ms": "2500"}, 2_500),
    ],
)
def test_issue12_item7_the_longest_asked_delay_wins(headers: dict[str, str], ms: int) -> None:
    assert classify_http(503, headers, None, NOW).retry_after_ms == ms


@pytest.mark.parametrize(
    "value",
    [
        "Tue, 14 Nov 2023 22:15:20 GMT",  # IMF-fixdate
        "Tuesday, 14-Nov-23 22:15:20 GMT",  # RFC 850
        "Tue Nov 14 22:15:20 2023",  # asctime
    ],
)
def test_issue12_item7_every_http_date_form_is_parsed(value: str) -> None:
    assert parse_retry_after(value, NOW) == 120_000


@pytest.mark.parametrize(
    "value", ["Wed Nov 14 22:15:20 2023", "Tuesday, 14-Nov-23 22:15:20", "14 Nov 2023 junk"]
)
def test_issue12_item7_garbage_dates_stay_ignored(value: str) -> None:
    assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize(
    "body",
    [
        b"AnthropicException - Your credit balance is too low to access the Anthropic API. "
        b"Please go to Plans & Billing to upgrade or purchase credits.",
        b"upstream 400: YOUR CREDIT BALANCE IS TOO LOW \xff\xfe",  # any case, not even UTF-8
        b'"Your credit balance is too low to access the Anthropic API."',  # a bare JSON string
    ],
)
def test_r_http_2a_credit_balance_phrase_in_a_plain_text_body_is_quota(body: bytes) -> None:
    """Issue 29 item 20: relays and proxies in front of Anthropic pass its 400 on as text; the
    phrase is matched within the bounded body whatever the body's format."""
    got = classify_http(400, {"content-type": "text/plain"}, body, NOW)
    assert (got.kind, got.subkind) == (K.QUOTA, "credit_balance_too_low")
    # still bounded, and still only on the entry's status
    far = b"x" * MAX_BODY_BYTES + body
    assert classify_http(400, {}, far, NOW).kind is K.REQUEST_REJECTED
    assert classify_http(404, {}, body, NOW).kind is K.REQUEST_REJECTED
    assert classify_http(400, {}, b"Bad request: the balance is fine", NOW).kind is (
        K.REQUEST_REJECTED
    )
