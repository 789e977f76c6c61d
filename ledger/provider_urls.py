"""Known base URLs of providers (issue 13 item 1), shipped as data in data/provider_base_urls.json.

Invariant: a provider's calls go only to its own catalog `baseUrl`, or to the known URL for its
name and API from this table. There is no other default: a provider with neither is not offered
(`no_base_url`), so a credential is never posted to another provider's host.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from ledger.errors import UsageError

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

