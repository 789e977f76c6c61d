"""Inert configuration entries (R-CFG-4): fallbackModels entries and route rules that match nothing.

Warnings name the field and the entry's position, never the entry's text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.routes import glob_to_regex


def inert_entries(
    policy: Policy, catalog: Catalog, env: Mapping[str, str] | None = None
) -> list[str]:
    """Warnings for entries that match no available, text-capable catalog model."""
    available = catalog.available_providers(os.environ if env is None else env)
    keys = [m.key for m in catalog.models if m.provider in available and m.text_capable]
    warnings: list[str] = []
    if policy.default_model is not None and policy.default_model not in keys:
        warnings.append("defaultModel: matches no available catalog model")
    for i, entry in enumerate(policy.fallback_models):
        if entry not in keys:
            warnings.append(f"fallbackModels[{i}]: matches no available catalog model (inert)")
    for field, rules in (("allow", policy.routes.allow), ("deny", policy.routes.deny)):
        for i, rule in enumerate(rules):
            pattern = glob_to_regex(rule)
            if not any(pattern.fullmatch(k) for k in keys):
                warnings.append(f"routes.{field}[{i}]: matches no available catalog model (inert)")
    return warnings
