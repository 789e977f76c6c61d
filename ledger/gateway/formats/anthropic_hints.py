"""What an Anthropic body carries that only an Anthropic route can use, and what becomes of it on
a route of another format (R-FMT-4). The same-format route gets the body untouched (thinking
blocks and their signatures included); another format's route gets `plain(body)`:

| in the Anthropic body | on another format's route |
| --- | --- |
| `cache_control` on system, message or tool blocks | dropped (a caching hint), reported |
| `metadata`, `context_management` | dropped (hints for Anthropic's own servers), reported |
| thinking / redacted_thinking blocks of earlier turns | dropped (signed for Anthropic), reported |
| a tool with `defer_loading: true` | left out (loaded by Anthropic's tool search), reported |
| a `system`-role message (Claude Code sends its environment so) | appended to the system text |
| `thinking` budget | reasoning effort: < 2048 low, < 8192 medium, else high |
| `thinking` adaptive, `output_config.effort` | that effort (`max` is high); adaptive alone: high |

A route's configured effort wins over the caller's (R-RT-3, applied after translation). Each
drop is named in `x-ledger-dropped` on the answer. Pure functions over parsed JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HINT_FIELDS = ("metadata", "context_management")
EFFORT_FIELDS = ("thinking", "output_config")
CACHE_CONTROL = "cache_control"
THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
LOW_BELOW, MEDIUM_BELOW = 2048, 8192
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high", "xhigh": "high"}


def effort_of(body: Mapping[str, Any]) -> str | None:
    """The reasoning effort a caller's thinking asks for (None: no thinking)."""
    config = body.get("output_config")
    asked = config.get("effort") if isinstance(config, dict) else None
    if isinstance(asked, str) and asked in EFFORTS:
        return EFFORTS[asked]
    thinking = body.get("thinking")
    if not isinstance(thinking, dict):
        return None
    kind = thinking.get("type")
    if kind == "adaptive":
        return "high"
    budget = thinking.get("budget_tokens")
    if kind != "enabled" or not isinstance(budget, int) or isinstance(budget, bool):
        return None
    return "low" if budget < LOW_BELOW else "medium" if budget < MEDIUM_BELOW else "high"


def _uncached(block: object, dropped: set[str]) -> object:
    if isinstance(block, dict) and CACHE_CONTROL in block:
        dropped.add(CACHE_CONTROL)
        return {k: v for k, v in block.items() if k != CACHE_CONTROL}
    return block


def _blocks(content: object, dropped: set[str]) -> object:
    if not isinstance(content, list):
        return content
    kept = []
    for block in content:
        if isinstance(block, dict) and block.get("type") in THINKING_BLOCKS:
            dropped.add("thinking")
            continue
        if isinstance(block, dict) and block.get("type") == "tool_result":
            block = {**block, "content": _blocks(block.get("content", ""), dropped)}
        kept.append(_uncached(block, dropped))
    return kept


def _text(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in content
    ):
        return "".join(b["text"] for b in content)
    return None


def plain(body: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The body as another format's route can take it, and what was dropped (sorted names).
    A body that is not of the expected shape is returned as it is (its check says why)."""
    dropped: set[str] = set()
    out = {k: v for k, v in body.items() if k not in HINT_FIELDS + EFFORT_FIELDS}
    dropped.update(k for k in HINT_FIELDS if k in body)
    system = body.get("system")
    extra: list[str] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        kept = []
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "system":
                text = _text(_blocks(m.get("content"), dropped))
                if text is None:
                    return body, ()
                extra.append(text)
                continue
            if isinstance(m, dict) and "content" in m:
                m = {**m, "content": _blocks(m["content"], dropped)}
            kept.append(m)
        out["messages"] = kept
    if isinstance(system, list):
        system = _blocks(system, dropped)
    if extra:
        base = _text(system) if system is not None else ""
        if base is None:
            return body, ()
        system = "\n\n".join(t for t in (base, *extra) if t)
    if system is not None:
        out["system"] = system
    tools = body.get("tools")
    if isinstance(tools, list):
        if any(isinstance(t, dict) and t.get("defer_loading") is True for t in tools):
            dropped.add("tools.defer_loading")
        out["tools"] = [
            _uncached({k: v for k, v in t.items() if k != "defer_loading"}, dropped)
            if isinstance(t, dict)
            else t
            for t in tools
            if not (isinstance(t, dict) and t.get("defer_loading") is True)
        ]
    return out, tuple(sorted(dropped))
