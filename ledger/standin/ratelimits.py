"""The rate-limit headers the stand-in sends (R-TOK-4): what OpenAI and Anthropic report of an
account's token limits on their answers, so the ledger's learned limits show in tests and the demo.

By default every successful answer reports a per-minute token limit (DEFAULT_TOKENS_PER_MINUTE)
and what is left of it: the limit minus the tokens the stand-in answered for that model in the
current wall-clock minute, reset at the minute's end. A scripted reply may say exactly what is
left and when it resets instead (`Scripted.tokens_remaining`, `tokens_reset_s`), on any status.
Enforcing (`StandIn(enforce_tokens=True)`), the stand-in answers 429 instead of a success whose
tokens do not fit what is left of the window, as a provider holding a token rate limit does.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

DEFAULT_TOKENS_PER_MINUTE = 1_000_000
_FAMILIES = ("tokens", "input-tokens", "output-tokens")


def go_duration(seconds: float) -> str:
    """A reset the way OpenAI writes it: `120ms`, `20s`, `1.5s`, `6m0s`."""
    ms = max(1, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    secs = f"{rest // 1000}" if rest % 1000 == 0 else f"{rest / 1000:.3f}".rstrip("0")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def rfc3339(at_s: float) -> str:
    """A reset the way Anthropic writes it: an RFC 3339 time (UTC, whole seconds rounded up)."""
    whole = int(at_s) + (0 if at_s == int(at_s) else 1)
    return datetime.fromtimestamp(whole, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def headers(
    anthropic: bool,
    remaining: dict[str, int],
    reset_s: float,
    now_s: float,
    limit: int | None = None,
) -> list[tuple[str, str]]:
    """The answer's rate-limit headers in its format: `remaining` per family (`tokens`,
    `input-tokens`, `output-tokens`; OpenAI reports `tokens` only), reset in `reset_s`."""
    out: list[tuple[str, str]] = []
    for family, left in remaining.items():
        if anthropic:
            name = f"anthropic-ratelimit-{family}-"
            out += [(f"{name}remaining", str(left)), (f"{name}reset", rfc3339(now_s + reset_s))]
            if limit is not None:
                out.append((f"{name}limit", str(limit)))
        elif family == "tokens":
            out += [("x-ratelimit-remaining-tokens", str(left)),
                    ("x-ratelimit-reset-tokens", go_duration(reset_s))]  # fmt: skip
            if limit is not None:
                out.append(("x-ratelimit-limit-tokens", str(limit)))
    return out


class TokenMeter:
    """The tokens answered per model in the current wall-clock window (a minute unless
    `window_s` says otherwise), against `limit`."""

    def __init__(self, limit: int = DEFAULT_TOKENS_PER_MINUTE, window_s: float = 60.0) -> None:
        self.limit = limit
        self.window_s = window_s
        self._lock = threading.Lock()
        self._minute = -1
        self._spent: dict[tuple[str, str], int] = {}

    def spend(self, model: str, input_tokens: int, output_tokens: int, now_s: float) -> (
        tuple[dict[str, int], float]
    ):
        """Count one answer; what is left of each family and the seconds to the window's end."""
        minute = int(now_s // self.window_s)
        with self._lock:
            if minute != self._minute:
                self._minute, self._spent = minute, {}
            left = {}
            for family, tokens in (("tokens", input_tokens + output_tokens),
                                   ("input-tokens", input_tokens),
                                   ("output-tokens", output_tokens)):  # fmt: skip
                spent = self._spent.get((model, family), 0) + max(0, tokens)
                self._spent[model, family] = spent
                left[family] = max(0, self.limit - spent)
        return left, (minute + 1) * self.window_s - now_s

    def take(self, model: str, tokens: int, now_s: float) -> tuple[bool, int, float]:
        """Enforcing: count an answer of `tokens` when it fits what is left of the window (True),
        else count nothing (False); what is left of `tokens` after, and the seconds to the
        window's end."""
        window = int(now_s // self.window_s)
        with self._lock:
            if window != self._minute:
                self._minute, self._spent = window, {}
            spent = self._spent.get((model, "tokens"), 0)
            fits = spent + max(0, tokens) <= self.limit
            if fits:
                spent += max(0, tokens)
                self._spent[model, "tokens"] = spent
        return fits, max(0, self.limit - spent), (window + 1) * self.window_s - now_s
