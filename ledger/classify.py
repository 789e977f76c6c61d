"""Classify a provider outcome into a row of the error policy table (SPEC section 8, R-HTTP-2).

Invariant: a Classification holds only values from fixed sets chosen here (kinds, subkind tokens,
known error codes) plus integers parsed strictly from header metadata. Nothing from an error
body, an exception message or any other provider prose is ever searched, stored or echoed.
Every function is pure: time comes in as `now_ms`.
"""

from __future__ import annotations

import email.utils
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from functools import cache
from types import MappingProxyType

from ledger.errors import UsageError
from ledger.kinds import FailureKind

MAX_BODY_BYTES = 8192
MAX_HINT_MS = 7 * 24 * 3600 * 1000
"""Retry-After and reset hints beyond this horizon are capped at it (never dropped, never less)."""

_TOKEN = re.compile(r"[a-z0-9_.-]{1,64}")

_Q = FailureKind.QUOTA
_A = FailureKind.AUTH
_R = FailureKind.RATE_LIMIT
_T = FailureKind.TRANSPORT
_X = FailureKind.REQUEST_REJECTED
_S = FailureKind.SAFETY

KNOWN_ERROR_CODES: Mapping[str, FailureKind] = MappingProxyType(
    {
        # quota / billing: these win on any HTTP status
        "insufficient_quota": _Q,  # OpenAI (code and type)
        "billing_hard_limit_reached": _Q,  # OpenAI
        "billing_not_active": _Q,  # OpenAI
        "billing_error": _Q,  # Anthropic 402 error.type
        "credit_balance_too_low": _Q,  # Anthropic-style
        "insufficient_credits": _Q,  # OpenRouter-style
        "payment_required": _Q,  # generic 402 code
        "quota_exceeded": _Q,  # generic
        # Anthropic spend limits: 429 with error.details.error_code; they last until a reset
        "enforced_spend_limit_reached": _Q,
        "contract_spend_limit_reached": _Q,
        "ramp_limit_exceeded": _Q,
        # auth
        "invalid_api_key": _A,  # OpenAI
        "authentication_error": _A,  # Anthropic
        "permission_error": _A,  # Anthropic
        "unauthenticated": _A,  # Google error.status
        "permission_denied": _A,  # Google error.status
        # rate limits
        "rate_limit_exceeded": _R,  # OpenAI
        "rate_limit_error": _R,  # Anthropic
        "resource_exhausted": _R,  # Google 429 (quota-per-minute, not billing)
        "rate_limited": _R,  # Mistral-style
        # transport / provider health
        "server_error": _T,  # OpenAI
        "api_error": _T,  # Anthropic 500
        "overloaded_error": _T,  # Anthropic 529
        "unavailable": _T,  # Google
        "deadline_exceeded": _T,  # Google
        "internal": _T,  # Google
        # request rejected, including context overflow
        "context_length_exceeded": _X,  # OpenAI, Mistral
        "model_context_window_exceeded": _X,  # Anthropic
        "context_window_exceeded": _X,  # generic
        "invalid_request_error": _X,  # OpenAI, Anthropic, Mistral
        "not_found_error": _X,  # Anthropic
        "request_too_large": _X,  # Anthropic 413
        "model_not_found": _X,  # OpenAI
        "invalid_argument": _X,  # Google
        "not_found": _X,  # Google
        # safety / content policy (R-POL-11): on any 4xx they win, so a guard is never routed
        # around because it arrived as an HTTP error instead of a stop reason
        "content_policy_violation": _S,  # OpenAI error.code (images, moderation-blocked prompts)
        "content_filter": _S,  # Azure OpenAI error.code
        "responsibleaipolicyviolation": _S,  # Azure OpenAI error.innererror.code
        "safety": _S,  # Gemini promptFeedback.blockReason / candidates[].finishReason
        "prohibited_content": _S,  # Gemini
        "spii": _S,  # Gemini (sensitive personally identifiable information)
        "blocklist": _S,  # Gemini (a term on the blocklist)
    }
)
"""Known provider error codes/types (compared lower-cased) and the table row each one means."""

CONTEXT_OVERFLOW_CODES: frozenset[str] = frozenset(
    {"context_length_exceeded", "model_context_window_exceeded", "context_window_exceeded"}
)

# Where providers put their machine-readable code, in the order they are consulted.
_CODE_PATHS: tuple[tuple[str | int, ...], ...] = (
    ("error", "code"),
    ("error", "details", "error_code"),  # Anthropic spend limits
    ("error", "innererror", "code"),  # Azure OpenAI content filter
    ("error", "type"),
    ("error", "status"),
    ("code",),
    ("type",),
    ("status",),
    ("error",),
    ("promptFeedback", "blockReason"),  # Gemini prompt blocks
    ("candidates", 0, "finishReason"),  # Gemini candidate blocks
)


@dataclass(frozen=True)
class KnownPhrase:
    """R-HTTP-2a: an account state a provider reports only in prose, as one exact phrase.

    It applies to an error response with one of `statuses` whose bounded body contains `phrase`
    (case-insensitive), whatever the body's format; a body that is a JSON object must also have
    the provider's documented error shape (`shape`: each path carries its exact value), so the
    same words in another provider's envelope are not this entry. The body is searched for this
    phrase only and then dropped.
    """

    provider: str
    statuses: frozenset[int]
    shape: tuple[tuple[tuple[str, ...], str], ...]
    phrase: str
    kind: FailureKind
    subkind: str


KNOWN_PHRASES: tuple[KnownPhrase, ...] = (
    # Anthropic: {"type": "error", "error": {"type": "invalid_request_error", "message": "Your
    # credit balance is too low to access the Anthropic API. ..."}} - a billing state, not a
    # rejected request: it cools the provider, not one model whose siblings fail the same way.
    KnownPhrase(
        "anthropic",
        frozenset({400}),
        ((("type",), "error"), (("error", "type"), "invalid_request_error")),
        "credit balance is too low",
        _Q,
        "credit_balance_too_low",
    ),
)
"""The fixed phrase table: data, each entry with its provider, row and a test."""

_NORMAL_STOPS = frozenset(
    {"stop", "end_turn", "tool_use", "tool_calls", "function_call", "stop_sequence"}
)
# A reply cut short: Anthropic's `model_context_window_exceeded` stop is output that ran into the
# window after the request was accepted, so it is truncated output, not a rejected request.
_LENGTH_STOPS = frozenset({"length", "max_tokens", "model_context_window_exceeded"})
# A turn the provider paused to be continued later: the reply is not complete.
_INCOMPLETE_STOPS = frozenset({"pause_turn"})
_CONTEXT_STOPS = frozenset({"context_length_exceeded", "context_limit", "model_length"})
_SAFETY_STOPS = frozenset(
    {"content_filter", "refusal", "safety", "recitation", "blocklist", "prohibited_content", "spii"}
)


@dataclass(frozen=True)
class Classification:
    """A failure classified into a policy-table kind, with fixed-token detail and parsed hints."""

    kind: FailureKind
    subkind: str
    retry_after_ms: int | None = None
    reset_at_ms: int | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        """Refuse anything but fixed tokens, so free text cannot slip into a stored field."""
        if not isinstance(self.kind, FailureKind):
            raise UsageError("classification kind must be a FailureKind")
        if not _is_token(self.subkind):
            raise UsageError("classification subkind must match [a-z0-9_.-]{1,64}")
        if self.reason is not None and not _is_token(self.reason):
            raise UsageError("a failure reason must match [a-z0-9_.-]{1,64}")
        for hint in (self.retry_after_ms, self.reset_at_ms):
            if hint is not None and (isinstance(hint, bool) or not isinstance(hint, int)):
                raise UsageError("retry_after_ms and reset_at_ms must be int milliseconds")


def _is_token(value: object) -> bool:
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


# --------------------------------------------------------------------------- HTTP responses


def classify_http(
    status: int, headers: Mapping[str, str], body: bytes | None, now_ms: int
) -> Classification:
    """Classify an HTTP error response from its status, known body codes and hint headers."""
    codes = _known_codes(body)
    phrase = _known_phrase(status, body)
    kind, subkind = (phrase.kind, phrase.subkind) if phrase else _kind_for(status, codes)
    retry_after_ms, reset_at_ms = _hints(headers, now_ms)
    # a safety refusal pauses its source with the code as the reason (R-POL-5, R-POL-11)
    reason = subkind if kind is _S else None
    return Classification(
        kind, subkind, retry_after_ms=retry_after_ms, reset_at_ms=reset_at_ms, reason=reason
    )


def _known_phrase(status: int, body: bytes | None) -> KnownPhrase | None:
    """The KNOWN_PHRASES entry this error response matches, if any (R-HTTP-2a)."""
    rules = [p for p in KNOWN_PHRASES if status in p.statuses]
    if not rules or not isinstance(body, bytes | bytearray) or not body:
        return None
    text = bytes(body[:MAX_BODY_BYTES]).decode("utf-8", errors="replace")
    try:
        document: object = json.loads(text)
    except (ValueError, RecursionError):
        document = None  # plain text, as relays in front of the provider pass it on
    text = text.lower()
    for rule in rules:
        # a JSON object must have the provider's shape; any other body is matched as text
        shaped = not isinstance(document, dict) or all(
            _at(document, path) == value for path, value in rule.shape
        )
        if shaped and rule.phrase in text:
            return rule
    return None


def _at(document: dict[str, object], path: tuple[str, ...]) -> object:
    node: object = document
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


_STATUS_ROWS: Mapping[int, FailureKind] = MappingProxyType(
    {401: _A, 403: _A, 402: _Q, 429: _R, 408: _T, 400: _X, 404: _X, 413: _X, 422: _X}
)
"""The table's HTTP status triggers (every 5xx is transport as well)."""


def _kind_for(status: int, codes: tuple[str, ...]) -> tuple[FailureKind, str]:
    """Safety codes win on any 4xx, quota/billing codes on any status; else the status row, else
    `unknown`.

    A known code of another kind never sets the kind (a 409 carrying `rate_limit_exceeded` is not
    a rate limit); it only names the subkind when it agrees with the status row.
    """
    valid = isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599
    http = f"http_{status}" if valid else "http_invalid"
    safety = _code_of(codes, _S) if valid and 400 <= status <= 499 else None
    if safety is not None:
        return _S, safety
    quota = _code_of(codes, _Q)
    if quota is not None:
        return _Q, quota
    row = _STATUS_ROWS.get(status) if valid else None
    if row is None and valid and 500 <= status <= 599:
        row = _T
    if row is None:
        return FailureKind.UNKNOWN, http
    if row is _X and any(c in CONTEXT_OVERFLOW_CODES for c in codes):
        return _X, "context_overflow"
    if row in (_A, _Q):
        return row, http
    return row, _code_of(codes, row) or http


def _code_of(codes: tuple[str, ...], kind: FailureKind) -> str | None:
    return next((c for c in codes if KNOWN_ERROR_CODES[c] is kind), None)


def _known_codes(body: bytes | None) -> tuple[str, ...]:
    """Known codes found at the well-known code fields of a JSON error body, in path order."""
    if not isinstance(body, bytes | bytearray) or not body:
        return ()
    try:
        document = json.loads(bytes(body[:MAX_BODY_BYTES]).decode("utf-8"))
    except (ValueError, RecursionError):  # invalid UTF-8/JSON, huge ints, deep nesting
        return ()
    # Google REST sometimes wraps the error object in a one-element list.
    if isinstance(document, list) and document and isinstance(document[0], dict):
        document = document[0]
    if not isinstance(document, dict):
        return ()
    found: list[str] = []
    for value in _values_at(document):
        code = value.lower() if len(value) <= 64 else ""
        if code in KNOWN_ERROR_CODES and code not in found:
            found.append(code)
    return tuple(found)


def _values_at(document: dict[str, object]) -> Iterator[str]:
    for path in _CODE_PATHS:
        node: object = document
        for key in path:
            if isinstance(key, int):
                node = node[key] if isinstance(node, list) and len(node) > key else None
            else:
                node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, str):
            yield node


# --------------------------------------------------------------------------- hint headers

_DELTA_SECONDS = re.compile(r"[0-9]{1,64}(?:\.[0-9]{1,9})?")
# An absurd ask ("inf") is a long hint like any other: capped at the horizon (issue 24 item 3).
_INFINITE = frozenset({"inf", "+inf", "infinity", "+infinity"})
_HTTP_DATE_CHARS = re.compile(r"[A-Za-z0-9 ,:+-]{10,40}")
_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_GO_DURATION = re.compile(
    r"(?:(?P<h>[0-9]{1,6})h)?"
    r"(?:(?P<m>[0-9]{1,6})m(?!s))?"
    r"(?:(?P<s>[0-9]{1,9}(?:\.[0-9]{1,9})?)s)?"
    r"(?:(?P<ms>[0-9]{1,9}(?:\.[0-9]{1,9})?)ms)?"
)
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
# Rate-limit families whose reset headers are read: OpenAI durations, Anthropic RFC 3339 times.
_FAMILIES = ("requests", "tokens", "input-tokens", "output-tokens")


def parse_retry_after(value: str, now_ms: int) -> int | None:
    """Milliseconds from `Retry-After` (delta-seconds or any HTTP-date); None unless valid.

    HTTP-dates are IMF-fixdate, RFC 850 or asctime (RFC 9110 section 5.6.7), parsed by
    `email.utils`; a date in the past means no delay. Beyond the horizon: the horizon.
    """
    if not isinstance(value, str) or len(value) > 64:
        return None
    text = value.strip(" \t")
    if _DELTA_SECONDS.fullmatch(text):
        return _bounded(int(Decimal(text) * 1000))
    if text.lower() in _INFINITE:
        return MAX_HINT_MS
    date_ms = _parse_http_date(text)
    return None if date_ms is None else _bounded(max(0, date_ms - now_ms))


def _parse_retry_after_ms(value: str) -> int | None:
    text = value.strip(" \t") if isinstance(value, str) and len(value) <= 64 else ""
    if text.lower() in _INFINITE:
        return MAX_HINT_MS
    return _bounded(int(Decimal(text))) if _DELTA_SECONDS.fullmatch(text) else None


def parse_duration_ms(value: str) -> int | None:
    """OpenAI reset durations such as `6m0s`, `1.5s`, `250ms`, `1h2m3s`, in milliseconds
    (capped at the horizon); None unless valid."""
    text = value.strip(" \t") if isinstance(value, str) and len(value) <= 64 else ""
    match = _GO_DURATION.fullmatch(text) if text else None
    if match is None or not any(match.groupdict().values()):
        return None
    scale = {"h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
    total = sum(Decimal(match[unit]) * size for unit, size in scale.items() if match[unit])
    return _bounded(int(total))


def _parse_http_date(text: str) -> int | None:
    if not _HTTP_DATE_CHARS.fullmatch(text):
        return None
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (ValueError, TypeError, IndexError, OverflowError):
        return None
    if moment.tzinfo is None:  # asctime carries no zone: HTTP-dates are always GMT
        moment = moment.replace(tzinfo=UTC)
    if text[:3] in _WEEKDAYS and _WEEKDAYS.index(text[:3]) != moment.weekday():
        return None  # a date that contradicts its own weekday is garbage, not a hint
    try:
        return int(moment.timestamp() * 1000)
    except (ValueError, OverflowError):
        return None


def parse_timestamp_ms(value: str) -> int | None:
    """An RFC 3339 time (Anthropic's resets) in epoch milliseconds; None unless valid."""
    text = value.strip(" \t") if isinstance(value, str) and len(value) <= 64 else ""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    try:
        zone = UTC
        if not zulu:
            offset = timedelta(hours=int(off_h), minutes=int(off_m))
            zone = timezone(-offset if sign == "-" else offset)
        moment = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=zone
        )
        epoch_ms = int(moment.timestamp()) * 1000
    except (ValueError, OverflowError):
        return None
    if fraction:
        epoch_ms += int(Decimal(fraction) * 1000)
    return epoch_ms


def _bounded(ms: int) -> int | None:
    """A delay in 0..horizon: longer asks are capped at the horizon, never dropped."""
    return min(ms, MAX_HINT_MS) if ms >= 0 else None


def _header_view(headers: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased header names; a name given twice with different values is dropped (ambiguous)."""
    seen: dict[str, str | None] = {}
    try:
        items = list(headers.items())
    except Exception:  # a hostile mapping must not break classification
        return {}
    for name, value in items:
        if not isinstance(name, str) or not isinstance(value, str):
            continue
        key = name.lower()
        seen[key] = value if seen.get(key, value) == value else None
    return {k: v for k, v in seen.items() if v is not None}


def _hints(headers: Mapping[str, str], now_ms: int) -> tuple[int | None, int | None]:
    """Parse (retry_after_ms, reset_at_ms) from hint headers; garbage is ignored, never guessed."""
    view = _header_view(headers) if isinstance(headers, Mapping) else {}
    # Both may be sent; the longer asked delay wins (a cooldown is never shorter than asked).
    asked = [
        _parse_retry_after_ms(view["retry-after-ms"]) if "retry-after-ms" in view else None,
        parse_retry_after(view["retry-after"], now_ms) if "retry-after" in view else None,
    ]
    retry_after = max((ms for ms in asked if ms is not None), default=None)

    resets: dict[str, int] = {}
    for family in _FAMILIES:
        openai = view.get(f"x-ratelimit-reset-{family}")
        delta = parse_duration_ms(openai) if openai is not None else None
        if delta is not None:
            resets[f"x-ratelimit-remaining-{family}"] = now_ms + delta
        anthropic = view.get(f"anthropic-ratelimit-{family}-reset")
        moment = parse_timestamp_ms(anthropic) if anthropic is not None else None
        if moment is not None and moment > now_ms:
            resets[f"anthropic-ratelimit-{family}-remaining"] = min(moment, now_ms + MAX_HINT_MS)
    # Prefer the limits the provider says are exhausted; otherwise the latest reset (never shorter).
    exhausted = [at for remaining, at in resets.items() if view.get(remaining, "").strip() == "0"]
    chosen = exhausted or list(resets.values())
    return retry_after, (max(chosen) if chosen else None)


# --------------------------------------------------------------------------- stop reasons


def classify_stop_reason(stop_reason: str | None) -> Classification | None:
    """Classify a raw stop/finish reason enum; None means a normal stop (not a failure)."""
    if stop_reason is None:
        return None
    stop = stop_reason.lower() if isinstance(stop_reason, str) and len(stop_reason) <= 64 else ""
    if stop in _NORMAL_STOPS:
        return None
    if stop in _LENGTH_STOPS:
        return Classification(FailureKind.INVALID_OUTPUT, "length_stop")
    if stop in _INCOMPLETE_STOPS:
        return Classification(FailureKind.INVALID_OUTPUT, "incomplete_stop")
    if stop in _CONTEXT_STOPS:
        return Classification(FailureKind.REQUEST_REJECTED, "context_overflow")
    if stop in _SAFETY_STOPS:
        return Classification(FailureKind.SAFETY, f"{stop}_stop", reason=stop)
    return Classification(FailureKind.UNKNOWN, "unrecognised_stop")


# --------------------------------------------------------------------------- exceptions


@cache
def _exception_kinds() -> tuple[tuple[type[BaseException], FailureKind, str], ...]:
    """The exception table, built on first use: importing ledger does not load httpx or asyncio."""
    import asyncio  # lazy: `ledger status` and `--help` import classify; keep asyncio out

    import httpx  # lazy: keeps httpx out of `ledger --help` and `ledger status` start-up

    return (
        (asyncio.CancelledError, FailureKind.CANCELLED, "cancelled"),
        (KeyboardInterrupt, FailureKind.CANCELLED, "interrupted"),
        (SystemExit, FailureKind.CANCELLED, "shutdown"),
        (httpx.TimeoutException, _T, "timeout"),
        (TimeoutError, _T, "timeout"),
        (httpx.ConnectError, _T, "connect_error"),
        (httpx.RemoteProtocolError, _T, "protocol_error"),
        (httpx.ReadError, _T, "stream_cut"),
        (httpx.WriteError, _T, "write_error"),
        (httpx.NetworkError, _T, "network_error"),
        (httpx.ProxyError, _T, "proxy_error"),
        (ConnectionError, _T, "network_error"),
    )


def classify_exception(exc: BaseException) -> Classification:
    """Classify an exception by its type alone; its message is never read."""
    for exc_type, kind, subkind in _exception_kinds():
        if isinstance(exc, exc_type):
            return Classification(kind, subkind)
    return Classification(FailureKind.UNKNOWN, "exception")


# --------------------------------------------------------------------------- explicit outcomes


def classify_kind(kind: FailureKind | str, reason: str | None = None) -> Classification:
    """An outcome the caller states explicitly (e.g. invalid_output with reason `json_schema`)."""
    try:
        failure = FailureKind(kind)
    except ValueError:
        raise UsageError("unknown failure kind; see `ledger settle --help`") from None
    if reason is not None and not _is_token(reason):
        raise UsageError("a failure reason must match [a-z0-9_.-]{1,64}")
    return Classification(failure, "reported", reason=reason)
