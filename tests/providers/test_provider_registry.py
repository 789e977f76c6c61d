"""Issue 20 mend: the provider modules import each other without a circle.

`base.py` used to import its own adapters (inside `adapter_for`) while the adapters import `base`:
a circle that only a function-level import kept from failing. The registry of built-in adapters
now lives in `ledger/providers/registry.py`, which imports `base` and the adapters; nothing in the
package imports the registry back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ledger.providers
from ledger.catalog import NoBaseUrlError, Provider
from ledger.providers.anthropic_messages import AnthropicMessagesAdapter
from ledger.providers.openai_chat import OpenAIChatAdapter

PACKAGE = Path(ledger.providers.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every ledger.providers module a file imports, at any depth (function-level included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n.rsplit(".", 1)[-1] for n in names if n.startswith("ledger.providers.")}
    return found & {p.stem for p in PACKAGE.glob("*.py")}


def test_issue20_mend_no_import_circle_in_ledger_providers() -> None:
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in graph.get(start, set())
        )

    circles = sorted(m for m in graph if reaches(m, m))
    assert circles == []
    assert "registry" in graph  # the adapters are looked up in a module of their own


@pytest.mark.parametrize(
    ("api", "adapter"),
    [("openai-chat", OpenAIChatAdapter), ("anthropic-messages", AnthropicMessagesAdapter)],
)
def test_issue20_mend_registry_picks_the_adapter_by_api(api: str, adapter: type) -> None:
    provider = Provider.model_validate(
        {"api": api, "available": True, "baseUrl": "http://127.0.0.1:9/v1"}
    )
    assert type(ledger.providers.adapter_for(provider, {})) is adapter
    with pytest.raises(NoBaseUrlError):
        ledger.providers.adapter_for(provider.model_copy(update={"base_url": None}), {})
