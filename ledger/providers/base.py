"""The provider call contract: a request in, raw facts out (R-HTTP-1..3).

Invariant: an adapter never classifies and never raises for a provider or transport failure; it
returns a ProviderResponse holding only status, lower-cased headers, a bounded error body, a
detached transport exception, the raw stop reason and usage. The credential is read from the
environment at call time only and appears in no repr, response, exception or log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, NamedTuple, Protocol

import httpx

from ledger.catalog import NoBaseUrlError, Provider
from ledger.records import plausible_cost_usd, plausible_tokens
from ledger.targets import Effort

INVALID_RESPONSE = "invalid_response"
"""`stop_reason` of a 2xx reply whose body is unparsable or oversized: the worker classifies it as
`invalid_output` (with `ok=False`, `status` set and `exception=None`)."""

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    """One chat message; `content` is caller text and never logged."""

    role: Role
    content: str = field(repr=False)


@dataclass(frozen=True)
class CallRequest:
    """One provider call authorised by a reservation."""

    model_id: str
    messages: tuple[Message, ...] = field(repr=False)
    max_tokens: int
    deadline_ms: int
    reasoning: bool = False
    """The catalog's reasoning flag: such models take `max_completion_tokens` (OpenAI chat)."""
    effort: Effort | None = None
    """This route's reasoning effort (R-RT-2, R-RT-3); None: the provider's default."""


_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def _no_headers() -> Mapping[str, str]:
    return _NO_HEADERS


@dataclass(frozen=True)
class ProviderResponse:
    """Raw facts about one call; the error body and text are for the caller only, never stored."""

    ok: bool
    status: int | None
    headers: Mapping[str, str] = field(default_factory=_no_headers, repr=False)
    error_body: bytes | None = field(default=None, repr=False)
    exception: BaseException | None = None
    text: str | None = field(default=None, repr=False)
    stop_reason: str | None = None
    input_tokens: int | None = None
    """Prompt tokens billed at the input price (cache writes and reads not included)."""
    output_tokens: int | None = None
    cost_usd: float | None = None
    elapsed_ms: int = 0
    cache_write_tokens: int | None = None
    """Prompt tokens written to the provider's prompt cache."""
    cache_read_tokens: int | None = None
    """Prompt tokens read from the provider's prompt cache."""


class ProviderAdapter(Protocol):
    """Makes one call; returns facts, never raises for provider or transport failures."""

    def call(self, request: CallRequest, *, now_ms: Callable[[], int]) -> ProviderResponse:
        """Call the provider within `request.deadline_ms`."""
        ...


class HttpAdapter:
    """Common ground of the built-in httpx adapters: credential lookup, headers, safe repr."""

    anthropic_limits = False
    """Its provider reports token limits in `anthropic-ratelimit-*` headers (RFC 3339 resets)
    rather than `x-ratelimit-*` ones (duration resets): what a simulated provider sends."""

    def __init__(
        self, provider: Provider, env: Mapping[str, str], *, client: httpx.Client | None = None
    ) -> None:
        self._provider = provider
        self._env = env
        self._client = client

    def __repr__(self) -> str:
        return f"{type(self).__name__}(api={self._provider.api!r})"

    __str__ = __repr__

    @property
    def client(self) -> httpx.Client | None:
        """The shared client, or None to open one per call."""
        return self._client

    def credential(self) -> str | None:
        """The credential, read from the environment now; None when unset or empty."""
        name = self._provider.credential_env
        value = self._env.get(name) if name else None
        return value or None

    def base_url(self) -> str:
        """The provider's base URL without a trailing slash (adapter_for checked it is set)."""
        url = self._provider.base_url
        if url is None:
            raise NoBaseUrlError
        return url.rstrip("/")

    def option_headers(self) -> dict[str, str]:
        """Extra headers from `options.headers` (string values only)."""
        extra = self._provider.options.get("headers")
        if not isinstance(extra, dict):
            return {}
        return {k: v for k, v in extra.items() if isinstance(v, str)}

    def option_str(self, name: str, default: str) -> str:
        """A string option, or `default` when absent or not a string."""
        value = self._provider.options.get(name)
        return value if isinstance(value, str) and value else default


class UsageCounts(NamedTuple):
    """The token counts of one `usage` object, as the ledger bills them (any may be unknown):
    `input_tokens` leaves out the cache writes and reads, which are billed at their own prices.
    A whole answer and a stream's usage events are read by the same function (R-GW-5c)."""

    input_tokens: int | None
    output_tokens: int | None
    cache_write_tokens: int | None
    cache_read_tokens: int | None


def token_count(value: object) -> int | None:
    """A usage count when it is a plausible non-negative integer, else None."""
    return value if isinstance(value, int) and plausible_tokens(value) else None


def reported_cost(value: object) -> float | None:
    """A provider-reported USD cost when finite and non-negative, else None."""
    return float(value) if isinstance(value, int | float) and plausible_cost_usd(value) else None
