"""The GenAI semantic-convention names the ledger emits (R-OTEL-1): by default those of v1.36 to
v1.41, which most tracing backends read; `OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`
switches spans and metrics together to the latest experimental names.

What differs: the provider is also `gen_ai.system` by default (its name before v1.37, still read
by older backends) and only `gen_ai.provider.name` in the latest; the time to the first chunk is
the `gen_ai.server.time_to_first_token` histogram by default and, in the latest, the
`gen_ai.client.operation.time_to_first_chunk` histogram plus the span attribute
`gen_ai.response.time_to_first_chunk`; the latest adds `gen_ai.usage.cache_creation.input_tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
LATEST_VALUE = "gen_ai_latest_experimental"

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
MAX_TOKENS = "gen_ai.request.max_tokens"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
TOKEN_TYPE = "gen_ai.token.type"  # noqa: S105 - an attribute name, not a secret
ERROR_TYPE = "error.type"
DURATION = "gen_ai.client.operation.duration"
TOKEN_USAGE = "gen_ai.client.token.usage"  # noqa: S105 - a metric name

RESERVATION = "ledger.reservation.id"
SOURCE = "ledger.source"
ROLE = "ledger.attempt.role"
PROBE = "ledger.attempt.probe"
NUMBER = "ledger.attempt.number"
ROUTE = "ledger.route"
POOL = "ledger.pool"
POLICY_KIND = "ledger.policy.kind"
POLICY_SUBKIND = "ledger.policy.subkind"
POLICY_REASON = "ledger.policy.reason"
POLICY_ACTIONS = "ledger.policy.actions"
POLICY_NEXT = "ledger.policy.next"
LATE = "ledger.late"
REFUSAL = "ledger.refusal.reason"
ITEM_OUTCOME = "ledger.item.outcome"
ATTEMPTS = "ledger.attempts"


@dataclass(frozen=True)
class Names:
    """The names that differ between the two versions."""

    providers: tuple[str, ...]
    first_chunk_metric: str
    first_chunk_attribute: str | None
    cache_creation: str | None
    latest: bool


DEFAULT = Names(
    (PROVIDER, "gen_ai.system"), "gen_ai.server.time_to_first_token", None, None, latest=False
)
LATEST = Names(
    (PROVIDER,),
    "gen_ai.client.operation.time_to_first_chunk",
    "gen_ai.response.time_to_first_chunk",
    "gen_ai.usage.cache_creation.input_tokens",
    latest=True,
)


def names_for(env: Mapping[str, str]) -> Names:
    """The latest names when the opt-in variable lists `gen_ai_latest_experimental`."""
    chosen = {part.strip() for part in env.get(OPT_IN, "").split(",")}
    return LATEST if LATEST_VALUE in chosen else DEFAULT
