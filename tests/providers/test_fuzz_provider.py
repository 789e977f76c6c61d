"""SPEC 15 and issue 8 item 4: fuzzed provider responses from a real local server always classify.

Every example is one real HTTP exchange with `StandIn` on 127.0.0.1 through the built-in adapter
(`openai-chat` and `anthropic-messages`), followed by `classify_response` exactly as the worker
does it. Checked for every example: nothing escapes the adapter or the classifier; a non-ok call
gets a Classification whose kind the policy table allows for that status (SPEC 8); an ok call has
plausible parsed facts; the call ends within the request deadline plus a generous margin, and a
slow error body within the R-HTTP-2 read budget (R-HTTP-2, R-HTTP-3); the kept error body is at
most 8192 bytes (R-HTTP-2); hint values stay within their horizon; and no piece of a marker planted
in the reply appears in the Classification or in the reported exception (SPEC 8: provider text is
never echoed).

One stand-in per test function; each example replaces its script with `set_script`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ledger.catalog import Provider
from ledger.classify import KNOWN_ERROR_CODES, MAX_HINT_MS, Classification
from ledger.clock import now_ms
from ledger.kinds import FailureKind
from ledger.providers import INVALID_RESPONSE, CallRequest, Message, ProviderResponse, adapter_for
from ledger.standin.server import Scripted, StandIn
from ledger.worker.queue import classify_response

APIS = ["openai-chat", "anthropic-messages"]
MODEL = "fuzz-model"
MESSAGES = (Message("user", "hello"),)
DEADLINE_S = 2.0
MARGIN_S = 1.5
"""Generous slack over the deadline (no tight timing on a shared 2-core machine)."""
LONG_DEADLINE_S = 30.0
"""For slow error bodies: far beyond the R-HTTP-2 budget, so only that budget can end the read."""

ERROR_BODY_LIMIT = 8192
"""R-HTTP-2 as written in the spec (not the module constant, so changing that is caught)."""

MARKER = "zqxjkvwqjxzkwqvjxkzq"
"""Planted in replies. Only letters that no kind, subkind, code or field name strings together."""
MARKER_B = MARKER.encode()
MARKER_PIECES = frozenset(MARKER[i : i + 4] for i in range(len(MARKER) - 3))

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

TestFn = TypeVar("TestFn", bound=Callable[..., None])

_F = FailureKind
_TABLE_KINDS = frozenset({_F.QUOTA, _F.AUTH, _F.RATE_LIMIT, _F.TRANSPORT, _F.REQUEST_REJECTED})
_STOP_KINDS = frozenset({_F.INVALID_OUTPUT, _F.REQUEST_REJECTED, _F.SAFETY, _F.UNKNOWN})


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


def exchange(
    server: StandIn, api: str, reply: Scripted, deadline_s: float = DEADLINE_S
) -> tuple[ProviderResponse, Classification | None, float, int]:
    """One real call as the worker makes it: adapter, then classification at ledger time now."""
    server.set_script(MODEL, [reply])
    base = server.base_url_openai if api == "openai-chat" else server.base_url_anthropic
    provider = Provider.model_validate({"api": api, "baseUrl": base, "credentialEnv": "FUZZ_KEY"})
    adapter = adapter_for(provider, {"FUZZ_KEY": "fuzz-key"})  # the strict stand-in needs one
    started = time.monotonic()
    request = CallRequest(MODEL, MESSAGES, 64, now_ms() + int(deadline_s * 1000))
    response = adapter.call(request, now_ms=now_ms)
    at = now_ms()
    found = classify_response(response, at)
    return response, found, time.monotonic() - started, at


def permitted_kinds(response: ProviderResponse) -> frozenset[FailureKind]:
    """The policy-table rows (SPEC 8) a response may land in, from its raw facts alone."""
    exc = response.exception
    if exc is not None:
        if isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError):
            return frozenset({_F.TRANSPORT})
        return frozenset({_F.TRANSPORT, _F.UNKNOWN})
    status = response.status
    if status is not None and not 200 <= status < 300:
        # A known quota/billing code wins on any status, a safety code on any 4xx (R-POL-11).
        safety = frozenset({_F.SAFETY}) if 400 <= status <= 499 else frozenset()
        if status in (401, 403):
            return frozenset({_F.AUTH, _F.QUOTA}) | safety
        if status == 402:
            return frozenset({_F.QUOTA}) | safety
        if status == 429:
            return frozenset({_F.RATE_LIMIT, _F.QUOTA}) | safety
        if status == 408 or 500 <= status <= 599:
            return frozenset({_F.TRANSPORT, _F.QUOTA, _F.REQUEST_REJECTED}) | safety
        if status in (400, 404, 422):
            return frozenset({_F.REQUEST_REJECTED, _F.QUOTA}) | safety
        return _TABLE_KINDS | {_F.UNKNOWN} | safety
    if response.stop_reason == INVALID_RESPONSE:
        return frozenset({_F.INVALID_OUTPUT})
    return _STOP_KINDS


def leaked(text: str) -> set[str]:
    """Pieces of the planted marker found in `text` (case-insensitive)."""
    lowered = text.lower()
    return {piece for piece in MARKER_PIECES if piece in lowered}


def check(
    reply: Scripted,
    response: ProviderResponse,
    found: Classification | None,
    elapsed_s: float,
    at: int,
    *,
    bound_s: float = DEADLINE_S + MARGIN_S,
) -> None:
    """The invariants every fuzzed exchange must keep."""
    event("ok" if found is None else f"kind {found.kind.value}")
    if response.exception is not None:
        event(f"exception {type(response.exception).__name__}")
    assert elapsed_s < bound_s
    assert response.error_body is None or len(response.error_body) <= ERROR_BODY_LIMIT
    if response.status is not None:
        assert response.status == reply.status
    if response.ok:
        assert response.exception is None
        assert response.status is not None
        assert 200 <= response.status < 300
        assert isinstance(response.text, str)
        for count in (response.input_tokens, response.output_tokens):
            assert count is None or (type(count) is int and 0 <= count <= 10**12)
        cost = response.cost_usd
        assert cost is None or (math.isfinite(cost) and cost >= 0)
    else:
        assert found is not None, "a failed call must be classified"
    if found is not None:
        assert isinstance(found.kind, FailureKind)
        assert found.kind in permitted_kinds(response)
        if found.retry_after_ms is not None or found.reset_at_ms is not None:
            event("hint parsed")
        assert found.retry_after_ms is None or 0 <= found.retry_after_ms <= MAX_HINT_MS
        assert found.reset_at_ms is None or at <= found.reset_at_ms <= at + MAX_HINT_MS
        fields = [found.kind.value, found.subkind, found.reason or "", repr(found), str(found)]
        assert not leaked(" ".join(fields))
    if response.exception is not None:
        exc = response.exception
        assert not leaked(f"{exc!s} {exc!r} {exc.args!r}")


# ------------------------------------------------------------------ strategies: statuses, headers

# fmt: off
INTERESTING_STATUSES = [
    200, 400, 401, 402, 403, 404, 408, 422, 429, 500, 503, 529,
    100, 101, 103, 199, 201, 204, 205, 299, 300, 304, 307, 418, 451, 599,
]
STOPS = [
    "stop", "end_turn", "tool_use", "length", "max_tokens", "content_filter", "refusal",
    "context_limit", "STOP", "Length",
]
# fmt: on
statuses = st.one_of(st.sampled_from(INTERESTING_STATUSES), st.integers(100, 599))
error_statuses = st.one_of(
    st.sampled_from([400, 401, 402, 403, 429, 500, 503, 529]), st.integers(300, 599)
)

OPENAI_RESETS = ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]
ANTHROPIC_RESETS = [
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
]
REMAINING = [
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-remaining",
]
HINT_NAMES = ["Retry-After", "retry-after-ms", *OPENAI_RESETS, *ANTHROPIC_RESETS, *REMAINING]
FRAMING_NAMES = ["Content-Type", "Content-Length", "Content-Encoding", "Transfer-Encoding"]
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def imf_date(moment: datetime, weekday_shift: int = 0) -> str:
    """An HTTP-date (IMF-fixdate), optionally with a wrong weekday."""
    weekday = WEEKDAYS[(moment.weekday() + weekday_shift) % 7]
    return (
        f"{weekday}, {moment.day:02d} {MONTHS[moment.month - 1]} {moment.year:04d} "
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d} GMT"
    )


def rfc3339(moment: datetime, fraction: str, zone: str) -> str:
    """An RFC 3339 timestamp with any fraction and zone suffix (possibly nonsense)."""
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T"
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}{fraction}{zone}"
    )


def near_now(offset_s: int) -> datetime:
    """A moment `offset_s` seconds from the real clock (hints are relative to ledger time)."""
    return datetime.now(UTC) + timedelta(seconds=offset_s)


any_moment = st.datetimes(
    min_value=datetime(1, 1, 1),  # noqa: DTZ001 - hypothesis wants naive bounds
    max_value=datetime(9999, 12, 31, 23, 59, 59),  # noqa: DTZ001
)
moments = st.one_of(any_moment, st.integers(-40 * 86400, 40 * 86400).map(near_now))
ODD_VALUES = [
    *["", " ", "0", " 0 ", "-0", "-1", "1e3", "0x10", "nan", "inf", "0, 5", "99999999999"],
    *["9" * 64, "9" * 65, "1" * 12 + "." + "9" * 9, "\u0661\u0662\u0663", "\u00a0120"],
    *["Wed, 21 Oct 2015 07:28:00 GMT", "Thu, 21 Oct 2015 07:28:00 GMT"],
    *["Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT"],
    *["text/html; charset=utf-16", "application/json", "application/octet-stream"],
    *["gzip", "br", "chunked", "identity, chunked", MARKER, MARKER.upper()],
]
WEEK_S = 7 * 86400
# Mostly within the 7-day hint horizon, sometimes far beyond it (to be ignored, never kept).
future = st.one_of(st.integers(60, WEEK_S), st.integers(WEEK_S, 3000 * 86400)).map(near_now)
seconds = st.one_of(st.integers(0, WEEK_S), st.integers(-1000, 10**12)).map(str)
go_durations = st.from_regex(
    r"[0-9]{1,3}m[0-9]{1,2}s|[0-9]{1,4}ms|[0-9]{1,3}\.[0-9]s|[0-9]{1,6}h", fullmatch=True
)
imf_dates = st.builds(imf_date, future)
rfc3339_dates = st.builds(rfc3339, future, st.just(""), st.just("Z"))
plausible_hints = st.one_of(seconds, go_durations, imf_dates, rfc3339_dates)
"""Values a provider really sends, so parsed hints (and their bounds) are exercised too."""
matched_hints = st.one_of(
    st.tuples(st.just("Retry-After"), st.one_of(seconds, imf_dates)),
    st.tuples(st.just("retry-after-ms"), seconds),
    st.tuples(st.sampled_from(OPENAI_RESETS), go_durations),
    st.tuples(st.sampled_from(ANTHROPIC_RESETS), rfc3339_dates),
    st.tuples(st.sampled_from(REMAINING), st.sampled_from(["0", "1"])),
)
"""A hint header with a value in its own format."""
hint_values = st.one_of(
    plausible_hints,
    st.integers(-(10**30), 10**30).map(str),
    st.floats().map(str),
    st.from_regex(r"-?[0-9]{1,9}(h|m|s|ms)([0-9]{1,4}(\.[0-9]{1,12})?(m|s|ms))?", fullmatch=True),
    st.builds(imf_date, moments, st.sampled_from([0, 0, 1])),
    st.builds(
        rfc3339,
        moments,
        st.sampled_from(["", ".5", ".123456789", ".1234567890123"]),
        st.sampled_from(["Z", "z", "+00:00", "-23:59", "+99:99", "+05:30", ""]),
    ),
    st.sampled_from(ODD_VALUES),
)
"""Retry-After and reset values: negative, huge, fractional, dates of any year, wrong zones."""
header_values = st.one_of(
    hint_values,
    # Latin-1 reaches the client as bytes; NUL and other controls must be refused by the parser.
    st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=40),
    # Beyond Latin-1 the stand-in cannot even send the header: the client sees a dropped reply.
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"), max_size=8),
)
printable_values = st.one_of(
    hint_values.filter(lambda value: value.isascii()),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
)
header_names = st.one_of(
    st.sampled_from(HINT_NAMES),
    st.sampled_from(HINT_NAMES + FRAMING_NAMES),
    st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,24}", fullmatch=True),
)
header_lists = st.builds(
    lambda hints, tame, wild: (*hints, *tame, *wild),
    st.lists(
        st.one_of(matched_hints, st.tuples(st.sampled_from(HINT_NAMES), plausible_hints)),
        max_size=3,
    ),
    st.lists(st.tuples(header_names, printable_values), max_size=4),
    st.lists(st.tuples(header_names, header_values), max_size=1),
)
"""Mostly headers the parser accepts (so hints reach the classifier), sometimes one wild one."""
hint_header_lists = st.lists(
    st.tuples(st.sampled_from([*HINT_NAMES, "Content-Type"]), header_values), max_size=4
).map(tuple)

# ------------------------------------------------------------------ strategies: bodies

codes = st.one_of(
    st.sampled_from(sorted(KNOWN_ERROR_CODES)),
    st.sampled_from(sorted(KNOWN_ERROR_CODES)).map(str.upper),
    st.just(MARKER),
    st.text(max_size=20),
    st.integers(),
    st.none(),
)
marker_texts = st.text(max_size=30).map(lambda t: f"{t}{MARKER}{t}")
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), marker_texts
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
error_documents = st.one_of(
    st.fixed_dictionaries(
        {"error": st.fixed_dictionaries({"code": codes, "type": codes, "message": marker_texts})}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("error"),
            "error": st.fixed_dictionaries({"type": codes, "message": marker_texts}),
        }
    ),
    st.fixed_dictionaries(
        {"error": st.fixed_dictionaries({"status": codes, "message": marker_texts})}
    ).map(lambda d: [d]),
    st.fixed_dictionaries({"code": codes, "error": codes, "detail": marker_texts}),
    json_values,
)


QUOTA_PREFIX = b'{"error": {"code": "insufficient_quota", "message": "'


def dumps(document: Any) -> bytes:
    """JSON bytes, NaN and Infinity included (providers do send them)."""
    return json.dumps(document).encode()


def huge_body(fill: bytes, code: str) -> bytes:
    """An error document over 1 MB whose known code sits after the first 8192 bytes."""
    return (
        b'{"error": {"message": "'
        + fill * (1_200_000 // len(fill))
        + b'", "code": "%s"}}' % (code.encode())
    )


def deep_body(depth: int, opener: bytes, closer: bytes) -> bytes:
    """Nesting far beyond what the JSON parser recurses into."""
    return opener * depth + b"0" + closer * depth


raw_bodies = st.one_of(
    error_documents.map(dumps),
    # truncated JSON
    st.tuples(error_documents.map(dumps), st.integers(0, 120)).map(lambda t: t[0][: t[1]]),
    # binary and invalid UTF-8 around a known code
    st.binary(max_size=300).map(lambda b: b + MARKER_B + b),
    st.sampled_from([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"]).map(
        lambda bad: QUOTA_PREFIX + bad + MARKER_B + b'"}}'
    ),
    error_documents.map(lambda d: json.dumps(d).encode("utf-16")),
    error_documents.map(lambda d: b"\xef\xbb\xbf" + dumps(d)),
    # huge, deep, numeric and empty bodies
    st.builds(
        huge_body,
        st.sampled_from([MARKER_B, b"\xff", b"[", b" "]),
        st.sampled_from(["insufficient_quota", "rate_limit_exceeded"]),
    ),
    st.builds(
        deep_body,
        st.integers(900, 200_000),
        st.sampled_from([b"[", b'{"error":', b'{"error": {"code": ']),
        st.sampled_from([b"]", b"}"]),
    ),
    st.sampled_from(
        [
            b"",
            b" " * 20_000,
            b"null",
            b"[]",
            b'"' + MARKER_B + b'"',
            b'{"error": ' + b"9" * 5000 + b"}",
            b'{"error": {"code": NaN, "type": Infinity, "message": -Infinity}}',
            b'{"error": {"code": "insufficient_quota", "code": "' + MARKER_B + b'"}}',
            b"<html><body>" + MARKER_B + b"</body></html>",
        ]
    ),
)
any_text = st.one_of(marker_texts, st.text(max_size=50))
stop_reasons = st.one_of(
    st.none(),
    st.sampled_from(STOPS),
    any_text,
)
replies = st.one_of(
    # exact bytes on any status
    st.builds(Scripted, status=statuses, headers=header_lists, raw_body=raw_bodies),
    # the stand-in's own error document, with any code and a marker in the message
    st.builds(
        Scripted,
        status=error_statuses,
        headers=header_lists,
        error_code=st.one_of(st.sampled_from(sorted(KNOWN_ERROR_CODES)), any_text),
        error_message=marker_texts,
        error_body_bytes=st.sampled_from([None, None, 8000, 8192, 20_000, 1_100_000]),
        delay_s=st.sampled_from([0.0, 0.0, 0.0, 0.05]),
    ),
    # the stand-in's success document on any status below 300, sometimes cut short
    st.builds(
        Scripted,
        status=st.one_of(st.just(200), st.integers(100, 299)),
        headers=header_lists,
        text=any_text,
        stop_reason=stop_reasons,
        cost_usd=st.one_of(st.none(), st.floats()),
        cut_body=st.booleans(),
    ),
)


# ------------------------------------------------------------------ the fuzz tests


def with_examples(edges: list[Scripted]) -> Callable[[TestFn], TestFn]:
    """Run each edge case as an explicit hypothesis example, every time."""

    def decorate(test: TestFn) -> TestFn:
        for edge in reversed(edges):
            test = example(reply=edge)(test)
        return test

    return decorate


EDGE_REPLIES = [
    Scripted(status=100, raw_body=MARKER_B + b"\r\n\r\n"),  # the body parsed as a status line
    Scripted(status=101, raw_body=MARKER_B),
    Scripted(status=204, raw_body=MARKER_B),
    Scripted(status=304, raw_body=MARKER_B),
    Scripted(
        status=200, raw_body=b"zz\r\n" + MARKER_B, headers=(("Transfer-Encoding", "chunked"),)
    ),
    Scripted(status=500, raw_body=MARKER_B, headers=(("X-" + MARKER, "a\x00" + MARKER),)),
    Scripted(status=429, raw_body=b"{}", headers=(("Retry-After", "\u20ac"),)),
    Scripted(status=200, raw_body=b"x" * 10, headers=(("Content-Length", "99"),)),
    Scripted(status=200, raw_body=b"x" * 10, headers=(("Content-Encoding", "gzip"),)),
    Scripted(status=402, raw_body=huge_body(MARKER_B, "insufficient_quota")),
    Scripted(status=200, raw_body=b'{"choices": [' + MARKER_B * 70_000 + b"]}"),
    Scripted(status=200, raw_body=deep_body(100_000, b"[", b"]")),
    Scripted(status=500, raw_body=deep_body(5000, b'{"error":', b"}")),
    Scripted(status=400, raw_body=deep_body(100_000, b"[", b"]")),  # too deep within 8192 bytes
    Scripted(
        status=429,
        raw_body=b"{}",
        headers=(
            ("Retry-After", "99999999999"),
            ("x-ratelimit-reset-tokens", "999999h"),
            ("anthropic-ratelimit-tokens-reset", "9999-12-31T23:59:59Z"),
        ),
    ),
    Scripted(status=200, cut_body=True, text=MARKER * 100),
    Scripted(status=503, error_code=MARKER, error_message=MARKER, error_body_bytes=1_100_000),
    Scripted(status=200, delay_s=DEADLINE_S + MARGIN_S + 1),  # only the deadline ends this call
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("api", APIS)
@FUZZ
@given(reply=replies)
@with_examples(EDGE_REPLIES)
def test_spec_15_fuzzed_provider_responses_always_classify(
    standin: StandIn, api: str, reply: Scripted
) -> None:
    response, found, elapsed_s, at = exchange(standin, api, reply)
    check(reply, response, found, elapsed_s, at)


def openai_document(content: object, refusal: object, stop: object, usage: object) -> object:
    """A chat-completions body in the wire shape, with any field values."""
    message = {"role": "assistant", "content": content, "refusal": refusal}
    return {"choices": [{"index": 0, "message": message, "finish_reason": stop}], "usage": usage}


def anthropic_document(blocks: list[object], stop: object, usage: object) -> object:
    """A messages body in the wire shape, with any blocks and field values."""
    return {"type": "message", "content": blocks, "stop_reason": stop, "usage": usage}


counts = st.one_of(
    st.integers(-10, 10**13),
    st.sampled_from([-1, 10**12, 10**12 + 1, 2**63]),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
)
usages = st.one_of(
    st.fixed_dictionaries(
        {
            "prompt_tokens": counts,
            "completion_tokens": counts,
            "input_tokens": counts,
            "output_tokens": counts,
        },
        optional={"cost": st.one_of(counts, st.floats(allow_nan=True, allow_infinity=True))},
    ),
    json_values,
)
# Mostly fields of the right type (so the facts are parsed), sometimes any JSON value.
contents = st.one_of(any_text, any_text, st.none(), json_values)
stops = st.one_of(stop_reasons, stop_reasons, json_values)
block_types = st.sampled_from(["text", "text", "tool_use", MARKER])
blocks = st.one_of(
    st.fixed_dictionaries({"type": block_types, "text": any_text}),
    st.fixed_dictionaries({"type": block_types, "text": any_text}),
    st.fixed_dictionaries({"type": block_types, "text": contents}),
    json_values,
)
success_documents = st.one_of(
    st.builds(openai_document, contents, st.one_of(st.none(), any_text), stops, usages),
    st.builds(anthropic_document, st.lists(blocks, max_size=3), stops, usages),
)
success_replies = st.builds(
    Scripted,
    status=st.sampled_from([200, 200, 200, 201, 203, 206]),
    headers=hint_header_lists,
    raw_body=success_documents.map(dumps),
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("api", APIS)
@FUZZ
@given(reply=success_replies)
def test_r_http_1_fuzzed_success_documents_give_facts_or_a_classification(
    standin: StandIn, api: str, reply: Scripted
) -> None:
    response, found, elapsed_s, at = exchange(standin, api, reply)
    check(reply, response, found, elapsed_s, at)
    if response.status is not None and not response.ok:
        assert response.stop_reason == INVALID_RESPONSE
        assert found == Classification(FailureKind.INVALID_OUTPUT, INVALID_RESPONSE)


printable_hint_header_lists = st.lists(
    st.tuples(
        st.sampled_from(HINT_NAMES),
        printable_values,
    ),
    max_size=4,
).map(tuple)
"""Hint headers the HTTP parser accepts, so the slow body is what the client must deal with."""
slow_replies = st.builds(
    Scripted,
    status=error_statuses,
    headers=printable_hint_header_lists,
    trickle_body=st.just(True),
    trickle_interval_s=st.sampled_from([0.005, 0.05, 0.3, 5.0]),
    delay_s=st.sampled_from([0.0, 0.1]),
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", APIS)
@settings(FUZZ, max_examples=6)
@given(reply=slow_replies)
def test_r_http_2_slow_or_stalled_error_body_ends_within_the_read_budget(
    standin: StandIn, api: str, reply: Scripted
) -> None:
    # The deadline is far away: only the R-HTTP-2 budget (8192 bytes, 200 ms) can end the read.
    response, found, elapsed_s, at = exchange(standin, api, reply, deadline_s=LONG_DEADLINE_S)
    check(reply, response, found, elapsed_s, at, bound_s=reply.delay_s + MARGIN_S)
    assert response.status == reply.status
    assert response.error_body is not None
    assert set(response.error_body) <= {ord(" ")}


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("bad", ["\n", "\r", "\x00"], ids=["lf", "cr", "nul"])
def test_r_diag_3_credential_refused_by_the_http_parser_is_not_quoted(
    standin: StandIn, api: str, bad: str
) -> None:
    # h11 quotes a header value it refuses; that value is ours and holds the credential.
    base = standin.base_url_openai if api == "openai-chat" else standin.base_url_anthropic
    provider = Provider.model_validate({"api": api, "baseUrl": base, "credentialEnv": "FUZZ_KEY"})
    adapter = adapter_for(provider, {"FUZZ_KEY": f"sk-{MARKER}{bad}"})
    response = adapter.call(CallRequest(MODEL, MESSAGES, 64, now_ms() + 2000), now_ms=now_ms)
    assert isinstance(response.exception, httpx.LocalProtocolError)
    assert classify_response(response, now_ms()) is not None
    exc = response.exception
    assert not leaked(f"{response!r} {exc!s} {exc!r} {exc.args!r}")
