"""The model catalog `catalog.json` (R-CAT-1..3): providers, models, prices; availability from env.

Credentials are only ever looked up by name to decide availability or to make a call; their values
are never stored, logged or printed.
"""


from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr, model_validator

from ledger.errors import UsageError
from ledger.home import write_atomic
from ledger.validation import Derived, Printable, Slot, load_document, parse_document

CATALOG_FILE = "catalog.json"
NO_CATALOG = (
    "the catalog has no models: run `ledger catalog init` (an example to edit) or "
    "`ledger catalog import-litellm FILE`"
)
_NO_BASE_URL: Slot[None, frozenset[str]] = Slot("providers without a base URL")

Price = Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)]
Count = Annotated[int, Field(gt=0, le=10**10)]
Modality = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
ProviderName = Annotated[str, Field(pattern=r"^[^/\s]{1,100}$"), Printable]
ModelId = Annotated[str, Field(pattern=r"^[^\s]{1,200}$"), Printable]


class Provider(BaseModel):
    """One provider account family and how its availability is decided."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    available: bool | None = None
    credential_env: str | None = Field(
        None, alias="credentialEnv", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
    )
    api: Literal["openai-chat", "anthropic-messages", "openai-responses"] = "openai-chat"
    base_url: Annotated[str, Printable] | None = Field(
        None, alias="baseUrl", pattern=r"^https?://[^\s]{1,500}$"
    )
    options: dict[str, JsonValue] = Field(default_factory=dict)
    betas: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9*][A-Za-z0-9._-]{0,99}$")]] | None = (
        Field(None, max_length=100)
    )
    """`anthropic-beta` flags the gateway forwards to this provider (exact flags, or `"*"`: all);
    any other flag a caller sends is dropped and reported (R-FMT-4)."""

    def allows_beta(self, flag: str) -> bool:
        """The provider takes this `anthropic-beta` flag (`betas`: the flag itself or `*`)."""
        return self.betas is not None and ("*" in self.betas or flag in self.betas)

    @model_validator(mode="after")
    def _has_availability(self) -> Provider:
        if self.available is None and self.credential_env is None:
            raise ValueError("rule: needs `available` or `credentialEnv`")
        return self

    def is_available(self, env: Mapping[str, str]) -> bool:
        """Marked available, or its credential variable is set and non-empty (R-CAT-2)."""
        if self.available is not None:
            return self.available
        return bool(self.credential_env and env.get(self.credential_env))


class PriceTier(BaseModel):
    """USD per million tokens up to an input size; the last tier has no bound."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    up_to_input_tokens: Count | None = Field(None, alias="upToInputTokens")
    input_usd_per_mtok: Price | None = Field(None, alias="inputUsdPerMTok")
    output_usd_per_mtok: Price | None = Field(None, alias="outputUsdPerMTok")
    cache_write_usd_per_mtok: Price | None = Field(None, alias="cacheWriteUsdPerMTok")
    """Prompt tokens written to the provider's cache (Anthropic bills them above input)."""
    cache_read_usd_per_mtok: Price | None = Field(None, alias="cacheReadUsdPerMTok")
    """Prompt tokens read from the provider's cache (usually a fraction of the input price)."""

    def input_prices(self) -> tuple[float | None, float | None, float | None]:
        """Every price a prompt token can be billed at in this tier: input, cache write, read."""
        return (
            self.input_usd_per_mtok,
            self.cache_write_usd_per_mtok,
            self.cache_read_usd_per_mtok,
        )


def _covers(tier: PriceTier, prompt_tokens: int) -> bool:
    return tier.up_to_input_tokens is None or prompt_tokens <= tier.up_to_input_tokens


class Model(BaseModel):
    """One catalog model; any size or price may be unknown."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    provider: ProviderName
    id: ModelId
    input: list[Modality] = Field(default_factory=lambda: ["text"], max_length=16)
    output: list[Modality] = Field(default_factory=lambda: ["text"], max_length=16)
    context_window: Count | None = Field(None, alias="contextWindow")
    max_output_tokens: Count | None = Field(None, alias="maxOutputTokens")
    reasoning: bool | None = False
    """Whether the model reasons (effort may be sent, R-RT-3); null: unknown."""
    prompt_cache_ttl_s: Count | None = Field(None, alias="promptCacheTtlS")
    """How long a cached prompt prefix lives after its last use (R-RT-6 `while-cached`)."""
    pricing: list[PriceTier] | None = Field(None, max_length=16)
    billed: Literal[False] | None = None
    """`false` marks a model that is never billed (free under a cost ceiling); absent: billed."""
    kind: Literal["chat", "embedding"] | None = None
    """What the model serves (R-FMT-3): chat (absent: chat) or embeddings; a request of one kind
    never lands on a model of the other, and an embedding model has no reply allowance."""

    @model_validator(mode="after")
    def _tiers_ordered(self) -> Model:
        tiers = self.pricing or []
        for i, tier in enumerate(tiers):
            last = i == len(tiers) - 1
            if last and tier.up_to_input_tokens is not None:
                raise ValueError("rule: the last pricing tier must have no upToInputTokens")
            if not last and tier.up_to_input_tokens is None:
                raise ValueError("rule: only the last pricing tier may omit upToInputTokens")
        bounds = [t.up_to_input_tokens for t in tiers[:-1]]
        if any(b is not None and a is not None and b <= a for a, b in itertools.pairwise(bounds)):
            raise ValueError("rule: pricing tiers must be ordered by upToInputTokens")
        return self

    @property
    def key(self) -> str:
        """`provider/model-id`."""
        return f"{self.provider}/{self.id}"

    @property
    def serves(self) -> str:
        """The kind of request it serves: `chat` or `embedding` (R-FMT-3)."""
        return self.kind or "chat"

    @property
    def text_capable(self) -> bool:
        """Accepts and produces text (R-SEL-1); an embedding model takes text (R-FMT-3)."""
        return "text" in self.input and (self.serves == "embedding" or "text" in self.output)

    @property
    def unbilled(self) -> bool:
        """The catalog says this model is never billed (`"billed": false`)."""
        return self.billed is False

    def price_known(self) -> bool:
        """Every tier has both prices, none of them zero, or the model is marked unbilled.

        A billed model's explicit 0 price is not assumed free (R-RES-2, R-SEL-6): an imported
        paid model with 0/0 in a price map must not pass a cost ceiling as free.
        """
        if self.unbilled:
            return True
        replies = self.serves == "chat"  # an embedding model bills its input only (R-FMT-3)
        return bool(self.pricing) and all(
            t.input_usd_per_mtok is not None
            and t.input_usd_per_mtok > 0
            and (not replies or (t.output_usd_per_mtok is not None and t.output_usd_per_mtok > 0))
            for t in self.pricing or []
        )

    def max_prices(self) -> tuple[Decimal, Decimal] | None:
        """The highest input and output tier prices (USD/MTok), or None when unknown."""
        if not self.price_known():
            return None
        if self.unbilled:
            return Decimal(0), Decimal(0)
        tiers = self.pricing or []
        return (
            max(Decimal(str(t.input_usd_per_mtok)) for t in tiers),
            max(Decimal(str(t.output_usd_per_mtok or 0)) for t in tiers),
        )

    def max_input_price(self) -> Decimal | None:
        """The highest per-token price a prompt token can be billed at (USD/MTok): every tier's
        input, cache-write and cache-read price; None when the price is unknown."""
        if not self.price_known():
            return None
        if self.unbilled:
            return Decimal(0)
        return max(
            Decimal(str(price))
            for t in self.pricing or []
            for price in t.input_prices()
            if price is not None
        )

    def tier_for(self, prompt_tokens: int) -> PriceTier:
        """The pricing tier a prompt of this many tokens (cached ones included) is billed at."""
        tiers = self.pricing or []
        return next(
            (t for t in tiers if _covers(t, prompt_tokens)),
            tiers[-1],
        )

    def reply_reservation(self, reply_tokens: int) -> int:
        """min(maxOutputTokens, replyTokens) (R-SEL-8); 0 for an embedding model (R-FMT-3)."""
        if self.serves == "embedding":
            return 0
        if self.max_output_tokens is None:
            return reply_tokens
        return min(self.max_output_tokens, reply_tokens)


class Catalog(BaseModel):
    """Providers and models as read from catalog.json."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    providers: dict[ProviderName, Provider] = Field(
        default_factory=dict
    )
    models: list[Model] = Field(default_factory=list, max_length=100_000)
    _by_key: dict[str, Model] = PrivateAttr(default_factory=dict)
    # Values derived from this (frozen) catalog, computed on first use and kept for its lifetime
    # (e.g. the selector's per-model keys and R-SEL-6 ranks). Never serialised.
    _derived: Derived = PrivateAttr(default_factory=Derived)

    @model_validator(mode="after")
    def _consistent(self) -> Catalog:
        if "pool" in self.providers:
            raise ValueError("rule: `pool` is a reserved provider name (pool keys, R-RT-4)")
        seen: set[str] = set()
        for model in self.models:
            if model.provider not in self.providers:
                raise ValueError("rule: a model names a provider that is not in `providers`")
            if model.key in seen:
                raise ValueError("rule: a model key appears twice")
            seen.add(model.key)
        return self

    @property
    def derived(self) -> Derived:
        """This catalog's cache of derived values (a reloaded catalog has its own, empty one)."""
        return self._derived

    def model(self, key: str) -> Model | None:
        """The model with this key, if any."""
        return self._by_key.get(key)

    def model_post_init(self, context: Any, /) -> None:
        self._by_key = {m.key: m for m in self.models}

    def require_model(self, key: str) -> Model:
        """The model with this key or a usage error (the key itself is not echoed)."""
        model = self.model(key)
        if model is None and not self.models:
            raise UsageError(f"unknown model: {NO_CATALOG}")
        if model is None:
            raise UsageError("unknown model: not in the catalog (see `ledger status` for routes)")
        return model

    def available_providers(self, env: Mapping[str, str] | None = None) -> frozenset[str]:
        """Names of providers available now (R-CAT-2)."""
        env = os.environ if env is None else env
        return frozenset(n for n, p in self.providers.items() if p.is_available(env))

    def credential_to_set(self, name: str) -> str | None:
        """The variable whose credential would make an unavailable provider available: its NAME,
        never its value (None when the catalog marks the provider unavailable outright)."""
        provider = self.providers.get(name)
        return provider.credential_env if provider and provider.available is None else None

    def base_url(self, name: str) -> str | None:
        """The provider's `baseUrl`, else the known one for its name and API, else None."""
        provider = self.providers.get(name)
        if provider is None:
            return None
        return provider.base_url or known_base_url(name, provider.api)

    def providers_without_base_url(self) -> frozenset[str]:
        """Providers with no base URL to call: never offered (`no_base_url`), never defaulted."""
        return self._derived.value(
            _NO_BASE_URL,
            None,
            lambda: frozenset(n for n in self.providers if self.base_url(n) is None),
        )

    def provider_for_call(self, name: str) -> Provider:
        """The provider with its resolved base URL, or NoBaseUrlError (nothing is sent)."""
        url = self.base_url(name)
        if url is None:
            raise NoBaseUrlError
        return self.providers[name].model_copy(update={"base_url": url})

    def to_json(self) -> dict[str, Any]:
        """The catalog as camelCase JSON data (unset optional fields left out)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


def split_model_key(key: str) -> tuple[str, str]:
    """Split `provider/model-id` at the first `/`."""
    provider, sep, model_id = key.partition("/")
    if not sep or not provider or not model_id:
        raise UsageError("a model key must look like provider/model-id")
    return provider, model_id


def parse_catalog(text: str | bytes, file: str = CATALOG_FILE) -> Catalog:
    """Validate catalog text or raise ConfigError."""
    return parse_document(Catalog, text, file)


def load_catalog(home: Path) -> Catalog:
    """Read `catalog.json` from the state directory; a missing file is an empty catalog."""
    return load_document(Catalog, home / CATALOG_FILE)


def example_catalog() -> Catalog:
    """The example catalog shipped with the package."""
    text = (Path(__file__).parent / "data" / "catalog.example.json").read_text()
    return parse_catalog(text, "catalog.example.json")


def dump_catalog(catalog: Catalog) -> str:
    """Canonical file text for a catalog."""
    return json.dumps(catalog.to_json(), indent=2) + "\n"


class CatalogWriteError(UsageError):
    """catalog.json cannot be written to the state directory; the old file (if any) is unchanged"""


def catalog_path(home: Path) -> Path:
    """Where `catalog.json` lives in a state directory."""
    return home / CATALOG_FILE


def catalog_exists(home: Path) -> bool:
    """Whether the state directory already holds a catalog.json."""
    return catalog_path(home).exists()


def write_catalog(home: Path, catalog: Catalog) -> Path:
    """Atomically replace `catalog.json` in an existing state directory with this catalog."""
    target = catalog_path(home)
    data = dump_catalog(catalog).encode()
    try:
        write_atomic(target, data)
    except OSError as exc:
        raise CatalogWriteError from exc
    return target


DATA_FILE = Path(__file__).parent / "data" / "provider_base_urls.json"


class NoBaseUrlError(UsageError):
    """the provider has no baseUrl in catalog.json and no known one: it is not called"""


@functools.cache
def known_providers() -> Mapping[str, tuple[str, str]]:
    """Provider name → (api, base URL) for the providers whose public endpoint is known."""
    document = json.loads(DATA_FILE.read_text())
    return MappingProxyType(
        {name: (entry["api"], entry["baseUrl"]) for name, entry in document.items()}
    )


@functools.cache
def _token_fields() -> Mapping[str, str]:
    document = json.loads(DATA_FILE.read_text())
    return MappingProxyType(
        {
            entry["baseUrl"]: entry["maxTokensField"]
            for entry in document.values()
            if "maxTokensField" in entry
        }
    )


def known_max_tokens_field(base_url: str) -> str | None:
    """The reply-limit field a known endpoint honours (`max_tokens` or `max_completion_tokens`).

    None for an endpoint not in the table. Taken from LiteLLM's own parameter mappings: these
    servers ignore or reject the other name, so a reasoning model's reply would go uncapped or
    the request would be refused (a 1 h cooldown).
    """
    return _token_fields().get(base_url.rstrip("/"))


def known_base_url(name: str, api: str) -> str | None:
    """The known base URL of provider `name` speaking `api`, or None."""
    known = known_providers().get(name)
    return known[1] if known is not None and known[0] == api else None
