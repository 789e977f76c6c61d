"""The built-in adapters by wire format (R-HTTP-1): the one module that knows them all.

It imports `base` and every adapter; no provider module imports it back, so the package has no
import circle (issue 20).
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from ledger.catalog import NoBaseUrlError, Provider
from ledger.providers.anthropic_messages import AnthropicMessagesAdapter
from ledger.providers.base import ProviderAdapter
from ledger.providers.openai_chat import OpenAIChatAdapter
from ledger.providers.openai_responses import OpenAIResponsesAdapter

ADAPTERS: Mapping[
    str, type[OpenAIChatAdapter | AnthropicMessagesAdapter | OpenAIResponsesAdapter]
] = {
    "openai-chat": OpenAIChatAdapter,
    "anthropic-messages": AnthropicMessagesAdapter,
    "openai-responses": OpenAIResponsesAdapter,
}
"""The adapter class of each catalog `api` (any other speaks `openai-chat`)."""


def adapter_for(
    provider: Provider, env: Mapping[str, str], *, client: httpx.Client | None = None
) -> ProviderAdapter:
    """The built-in adapter for `provider.api`; `env` is consulted for the credential per call.

    The provider must carry its base URL (`Catalog.provider_for_call` resolves known ones): there
    is no default host, so a credential never goes to another provider (NoBaseUrlError).
    """
    if provider.base_url is None:
        raise NoBaseUrlError
    adapter = ADAPTERS.get(provider.api, OpenAIChatAdapter)
    return adapter(provider, env, client=client)
