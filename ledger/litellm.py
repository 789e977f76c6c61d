"""Convert LiteLLM's `model_prices_and_context_window.json` into a Catalog (R-CAT-4).

Invariant: conversion is pure and total. Every top-level entry is either imported as one valid
catalog Model or counted under exactly one fixed skip reason; malformed input never raises
(except a document that is not a JSON object at all, which is a UsageError). Only `mode: "chat"`
entries are imported (and `mode: "embedding"` ones, as `"kind": "embedding"`, when asked:
R-FMT-3), and only base and input-size-tiered per-token prices are read: input, output, cache
write (the dearer of the 5-minute and 1-hour writes) and cache read; batch, priority, flex, audio
and other prices are ignored. Messages never echo file content.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Literal

from pydantic import ValidationError

from ledger.catalog import Catalog, Model, PriceTier, Provider, known_providers
from ledger.errors import UsageError


class SkipReason(StrEnum):
    """Why a LiteLLM entry was not imported (appears verbatim in CLI output)."""

    DOCUMENTATION = "documentation"
    NOT_CHAT = "not_chat"
    NO_PROVIDER = "no_provider"
    FILTERED = "filtered"
    BAD_ENTRY = "bad_entry"
    DUPLICATE = "duplicate"
    BAD_ALIAS = "bad_alias"
    TOO_MANY = "too_many"
    UNPRINTABLE_NAME = "unprintable_name"
    """The model key or provider name holds a control or format character (an ANSI escape):
    never imported, and never printed."""


@dataclass(frozen=True)
class ImportResult:
    """The converted catalog and how many entries were imported or skipped (by reason)."""

    catalog: Catalog
    imported: int
    skipped: int
    skipped_by_reason: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    conflicting_duplicates: tuple[str, ...] = ()
    """Model keys given by several entries with different data (the most complete one kept)."""
    aliases: int = 0
    """`alias_of` entries followed to their target."""


ApiName = Literal["openai-chat", "anthropic-messages"]
API_NAMES: Mapping[str, ApiName] = {
    "openai-chat": "openai-chat",
    "anthropic-messages": "anthropic-messages",
}
"""A known provider's api as the catalog has it (any other: `openai-chat`)."""


class _BadEntry(Exception):
    """Internal: an entry cannot be converted (never shown to a user)."""


DOCUMENTATION_KEYS = frozenset({"sample_spec"})
_PRICE_KEY = re.compile(
    r"(?P<side>input_cost_per_token|output_cost_per_token|cache_creation_input_token_cost"
    r"|cache_read_input_token_cost|input_cost_per_token_cache_hit)"
    r"(?P<hour>_above_1hr)?(?:_above_(?P<number>[0-9]{1,9})(?P<unit>k|m)?_tokens)?"
)
_SIDES = {
    "input_cost_per_token": "input",
    "output_cost_per_token": "output",
    "cache_creation_input_token_cost": "cache_write",
    "cache_read_input_token_cost": "cache_read",
    "input_cost_per_token_cache_hit": "cache_hit",
}
"""LiteLLM price names → our tier fields; `cache_hit` (DeepSeek's name) is a cache read price
used where no `cache_read_input_token_cost` is given."""
_MODALITY_FLAGS = (
    ("supports_vision", "image"),
    ("supports_pdf_input", "pdf"),
    ("supports_audio_input", "audio"),
)
_PROVIDER_NAME = re.compile(r"[^/\s]{1,100}")
_MAX_MODELS = 100_000
_MAX_TIERS = 16
_MAX_USD_PER_MTOK = Decimal(1_000_000)
_MAX_COUNT = 10**10
_MICRO = Decimal("0.000001")
_MILLION = Decimal(1_000_000)


def parse_litellm(text: str | bytes) -> Mapping[str, Any]:
    """Parse LiteLLM file text into its top-level object or raise UsageError (never echoes it)."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UsageError("the LiteLLM file is not valid JSON") from exc
    if not isinstance(document, dict):
        raise UsageError("the LiteLLM file must be a JSON object")
    return document


def credential_env_for(provider: str) -> str:
    """`<PROVIDER>_API_KEY` with every character outside [A-Z0-9_] replaced by `_`."""
    name = re.sub(r"[^A-Z0-9_]", "_", provider.upper())[:100]
    if not name or name[0].isdigit():
        name = "_" + name
    return f"{name}_API_KEY"


def provider_for(name: str) -> Provider:
    """The provider entry for an imported name: its known API and base URL, else none (issue 13).

    A provider whose endpoint is not known gets no baseUrl: it is not offered (`no_base_url`)
    until the user sets one, rather than defaulting to another provider's host.
    """
    known = known_providers().get(name)
    api = API_NAMES.get(known[0], "openai-chat") if known is not None else "openai-chat"
    return Provider(
        credential_env=credential_env_for(name),
        api=api,
        base_url=known[1] if known else None,
    )


CHAT_ONLY = frozenset({"chat"})
WITH_EMBEDDINGS = frozenset({"chat", "embedding"})
"""LiteLLM's `mode` values imported: chat, and embeddings when asked (R-FMT-3)."""


def convert(
    document: object, providers: frozenset[str] | None = None, kinds: frozenset[str] = CHAT_ONLY
) -> ImportResult:
    """Convert a parsed LiteLLM price map; `providers` keeps only those litellm_provider values,
    `kinds` those `mode` values (WITH_EMBEDDINGS adds embedding models, R-FMT-3).

    `alias_of` entries are imported under their own key with their target's data. When several
    entries give the same model key, the priced and most complete one is kept (the first among
    equals); keys whose entries disagree are listed in `conflicting_duplicates`. A `providers`
    filter naming a provider with no chat entry in the file is a UsageError.
    """
    if not isinstance(document, Mapping):
        raise UsageError("the LiteLLM file must be a JSON object")
    skipped: Counter[str] = Counter()
    candidates: dict[str, list[Model]] = {}
    chat_providers: set[str] = set()
    aliases = 0
    for key, raw in document.items():
        entry = _resolve_alias(document, raw)
        if entry is _BROKEN_ALIAS:
            skipped[SkipReason.BAD_ALIAS.value] += 1
            continue
        aliases += entry is not raw
        reason = _skip_reason(key, entry, providers, kinds)
        if reason in (None, SkipReason.FILTERED):  # names here are printable
            chat_providers.add(entry["litellm_provider"])
        if reason is None:
            try:
                model = _model(key, entry)
            except _BadEntry:
                reason = SkipReason.BAD_ENTRY
            else:
                candidates.setdefault(model.key, []).append(model)
        if reason is not None:
            skipped[reason.value] += 1
    if providers is not None and not providers <= chat_providers:
        raise UsageError(_unmatched(providers - chat_providers, chat_providers))
    models: list[Model] = []
    conflicts: list[str] = []
    for key, group in candidates.items():
        if len(models) >= _MAX_MODELS:
            skipped[SkipReason.TOO_MANY.value] += len(group)
            continue
        models.append(max(group, key=_completeness))  # max() keeps the first among equals
        if len(group) > 1:
            skipped[SkipReason.DUPLICATE.value] += len(group) - 1
            if any(m != group[0] for m in group[1:]):
                conflicts.append(key)
    names = sorted({m.provider for m in models})
    catalog = Catalog(providers={n: provider_for(n) for n in names}, models=models)
    return ImportResult(
        catalog=catalog,
        imported=len(models),
        skipped=sum(skipped.values()),
        skipped_by_reason=MappingProxyType(dict(sorted(skipped.items()))),
        conflicting_duplicates=tuple(conflicts),
        aliases=aliases,
    )


_WORD = r"(?:[a-z]+[0-9]{0,2}|[0-9]{1,2})"
_ECHOABLE_NAME = re.compile(rf"{_WORD}(?:[-_.]{_WORD}){{0,5}}")
"""What a `--providers` name must look like to be echoed (`vertex_ai-language-models`, `01.ai`): a
pasted credential (long runs of mixed letters and digits) is never shown."""


def _shown_name(name: str) -> str | None:
    return name if len(name) <= 40 and _ECHOABLE_NAME.fullmatch(name) else None


def _unmatched(missing: Iterable[str], chat_providers: Iterable[str]) -> str:
    """`--providers` names that match no chat model: named when they read like provider names,
    with the nearest provider in the file."""
    missing = sorted(missing)
    shown = [n for n in missing if _shown_name(n)]
    text = f"--providers: {len(missing)} name(s) match no chat model in the file"
    if shown:
        text += ": " + ", ".join(f"`{n}`" for n in shown)
        if len(shown) < len(missing):
            text += f" and {len(missing) - len(shown)} not shown"
        known = sorted(n for n in chat_providers if _shown_name(n))
        near = difflib.get_close_matches(shown[0], known, n=1)
        if near:
            text += f"; did you mean `{near[0]}`?"
    return text


_MAX_ALIAS_HOPS = 8
_BROKEN_ALIAS = object()


def _resolve_alias(document: Mapping[Any, Any], entry: Any) -> Any:
    """The entry an `alias_of` chain leads to (the alias's own fields win), or _BROKEN_ALIAS."""
    seen = 0
    while isinstance(entry, Mapping) and "alias_of" in entry:
        target = entry["alias_of"]
        seen += 1
        if not isinstance(target, str) or seen > _MAX_ALIAS_HOPS:
            return _BROKEN_ALIAS
        found = document.get(target)
        if not isinstance(found, Mapping):
            return _BROKEN_ALIAS
        own = {k: v for k, v in entry.items() if k != "alias_of"}
        entry = {**found, **own}
    return entry


def _completeness(model: Model) -> tuple[bool, int]:
    """Rank duplicates: a known price first (an imported 0 price counts as unknown: the import
    never marks a model `billed: false`), then known sizes."""
    return (
        model.max_prices() is not None,
        (model.context_window is not None) + (model.max_output_tokens is not None),
    )


def merge(existing: Catalog, imported: Catalog) -> Catalog:
    """Update prices and sizes of same-key models, add new models and providers; keep the rest."""
    fresh = {m.key: m for m in imported.models}
    models: list[Model] = []
    for model in existing.models:
        new = fresh.pop(model.key, None)
        models.append(model if new is None else _updated(model, new))
    models.extend(fresh.values())
    providers = dict(existing.providers)
    for name, provider in imported.providers.items():
        providers.setdefault(name, provider)
    try:
        return Catalog(providers=providers, models=models)
    except ValidationError as exc:
        raise UsageError("the merged catalog would be invalid (too many models?)") from exc


def _updated(model: Model, new: Model) -> Model:
    """Known imported prices and sizes replace the existing ones; unknown ones erase nothing."""
    update: dict[str, Any] = {}
    if new.pricing is not None:
        update["pricing"] = new.pricing
    if new.context_window is not None:
        update["context_window"] = new.context_window
    if new.max_output_tokens is not None:
        update["max_output_tokens"] = new.max_output_tokens
    return model.model_copy(update=update)


def _skip_reason(
    key: object, entry: object, providers: frozenset[str] | None, kinds: frozenset[str]
) -> SkipReason | None:
    if key in DOCUMENTATION_KEYS:
        return SkipReason.DOCUMENTATION
    if not isinstance(key, str) or not isinstance(entry, Mapping):
        return SkipReason.BAD_ENTRY
    mode = entry.get("mode")
    if not isinstance(mode, str) or mode not in kinds:
        return SkipReason.NOT_CHAT
    provider = entry.get("litellm_provider")
    if not isinstance(provider, str) or not provider:
        return SkipReason.NO_PROVIDER
    if not (key.isprintable() and provider.isprintable()):
        return SkipReason.UNPRINTABLE_NAME
    if providers is not None and provider not in providers:
        return SkipReason.FILTERED
    return None


def _model(key: str, entry: Mapping[str, Any]) -> Model:
    provider: str = entry["litellm_provider"]
    if not _PROVIDER_NAME.fullmatch(provider):
        raise _BadEntry
    model_id = key.removeprefix(f"{provider}/")
    max_input = _count(entry.get("max_input_tokens"))
    max_output = _count(entry.get("max_output_tokens"))
    max_tokens = _count(entry.get("max_tokens"))
    window = max_input if max_input is not None else (max_tokens if max_output is None else None)
    modalities = ["text"] + [m for flag, m in _MODALITY_FLAGS if _flag(entry.get(flag))]
    try:
        return Model(
            provider=provider,
            id=model_id,
            input=modalities,
            output=["text"],
            context_window=window,
            max_output_tokens=max_output,
            reasoning=_flag(entry.get("supports_reasoning")),
            pricing=_pricing(entry),
            kind=None if entry["mode"] == "chat" else "embedding",
        )
    except ValidationError as exc:
        raise _BadEntry from exc


def _pricing(entry: Mapping[str, Any]) -> list[PriceTier] | None:
    """Base prices plus one tier per `*_above_<N>k_tokens` threshold, ordered by threshold.

    A cache write is priced at the dearest write price listed for its tier (the 5-minute or the
    1-hour cache; a reply need not say which one it wrote), so it is never under-counted.
    """
    prices: dict[int, dict[str, float]] = {}  # threshold (0: base) → side → USD per MTok
    for name, value in entry.items():
        match = _PRICE_KEY.fullmatch(name) if isinstance(name, str) else None
        if match is None or value is None:
            continue
        side = _SIDES[match["side"]]
        if match["hour"] and side != "cache_write":
            continue
        threshold = 0
        if match["number"] is not None:
            threshold = int(match["number"]) * {"k": 1_000, "m": 1_000_000, None: 1}[match["unit"]]
            if not 0 < threshold <= _MAX_COUNT:
                raise _BadEntry
        price = _usd_per_mtok(value)
        if price is None:
            raise _BadEntry
        if price == 0 and side.startswith("cache"):
            continue  # a zero cache price is priced like a missing one (never free): leave it out
        tier = prices.setdefault(threshold, {})
        tier[side] = max(price, tier.get(side, price))
    for tier in prices.values():
        hit = tier.pop("cache_hit", None)
        if hit is not None:
            tier.setdefault("cache_read", hit)
    thresholds = sorted(t for t in prices if t > 0)
    if len(thresholds) >= _MAX_TIERS:
        raise _BadEntry
    base = prices.get(0, {})
    if not thresholds and base.get("input") is None and base.get("output") is None:
        return None
    bounds: list[int | None] = [*thresholds, None]
    tiers: list[PriceTier] = []
    current = dict(base)
    for i, bound in enumerate(bounds):
        if i > 0:
            # above a threshold a side without its own tier price keeps its previous price
            current.update(prices[thresholds[i - 1]])
        tiers.append(
            PriceTier(
                up_to_input_tokens=bound,
                input_usd_per_mtok=current.get("input"),
                output_usd_per_mtok=current.get("output"),
                cache_write_usd_per_mtok=current.get("cache_write"),
                cache_read_usd_per_mtok=current.get("cache_read"),
            )
        )
    return tiers


def _usd_per_mtok(value: object) -> float | None:
    """USD per token → USD per million tokens, rounded to 6 decimals; None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadEntry
    if isinstance(value, float) and not math.isfinite(value):
        raise _BadEntry
    try:
        per_mtok = (Decimal(value) if isinstance(value, int) else Decimal(repr(value))) * _MILLION
        if per_mtok < 0 or per_mtok > _MAX_USD_PER_MTOK:
            raise _BadEntry
        return float(per_mtok.quantize(_MICRO))
    except InvalidOperation as exc:
        raise _BadEntry from exc


def _count(value: object) -> int | None:
    """A positive token count (integral floats accepted); None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadEntry
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise _BadEntry
    count = int(value)
    if not 0 < count <= _MAX_COUNT:
        raise _BadEntry
    return count


def _flag(value: object) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _BadEntry
    return value
