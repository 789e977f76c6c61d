"""Effort on the wire (R-RT-3): the documented maps from a route's effort level to what each API
is sent. `none` sends nothing; a route without an effort sends nothing (the provider's default).

OpenAI-compatible chat: `reasoning_effort`, mapped by `OPENAI_REASONING_EFFORT`.
Anthropic messages: `thinking: {"type": "enabled", "budget_tokens": N}` with N from
`ANTHROPIC_THINKING_BUDGET`, kept inside the reply allowance (`max_tokens`, which the cost
estimate already covers): N = min(table, max_tokens - ANTHROPIC_ANSWER_FLOOR); when that is below
the API's minimum budget (1024) no thinking is sent.
"""

from __future__ import annotations

from collections.abc import Mapping

from ledger.targets import Effort

OPENAI_REASONING_EFFORT: Mapping[Effort, str] = {
    Effort.MINIMAL: "minimal",
    Effort.LOW: "low",
    Effort.MEDIUM: "medium",
    Effort.HIGH: "high",
    Effort.XHIGH: "high",
    Effort.MAX: "high",
}
"""`reasoning_effort` per level (the API's values are minimal/low/medium/high)."""

ANTHROPIC_THINKING_BUDGET: Mapping[Effort, int] = {
    Effort.MINIMAL: 1024,
    Effort.LOW: 2048,
    Effort.MEDIUM: 8192,
    Effort.HIGH: 16384,
    Effort.XHIGH: 32768,
    Effort.MAX: 65536,
}
"""Extended-thinking budget tokens per level, before the reply-allowance clamp."""
ANTHROPIC_MIN_BUDGET = 1024
ANTHROPIC_ANSWER_FLOOR = 1024
"""Reply tokens kept for the answer itself: the thinking budget never takes the whole allowance."""


def openai_fields(effort: Effort | None) -> dict[str, object]:
    """The chat-completions fields for an effort (none for `none` or no effort)."""
    if effort is None or effort is Effort.NONE:
        return {}
    return {"reasoning_effort": OPENAI_REASONING_EFFORT[effort]}


def anthropic_budget(effort: Effort | None, max_tokens: int) -> int | None:
    """The thinking budget inside `max_tokens`, or None when no thinking is sent."""
    if effort is None or effort is Effort.NONE:
        return None
    budget = min(ANTHROPIC_THINKING_BUDGET[effort], max_tokens - ANTHROPIC_ANSWER_FLOOR)
    return budget if budget >= ANTHROPIC_MIN_BUDGET else None


def anthropic_fields(effort: Effort | None, max_tokens: int) -> dict[str, object]:
    """The messages fields for an effort: `thinking` with its budget, or nothing."""
    budget = anthropic_budget(effort, max_tokens)
    if budget is None:
        return {}
    return {"thinking": {"type": "enabled", "budget_tokens": budget}}
