"""The error policy table (SPEC section 8) as data, and the pure decision over it (R-POL-1..7).

Invariant: `decide` is a pure function of a FailureContext and a jitter source. It never
shortens a cooldown it reports (the store keeps max(old, new), R-POL-2), never permits a fallback
from a paused source, a guard refusal or a side-effecting attempt (R-POL-5, R-POL-7), and never
puts provider text into a Decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from ledger.catalog import split_model_key
from ledger.classify import MAX_HINT_MS, Classification
from ledger.clock import (
    HOUR_MS,
    MINUTE_MS,
    SECOND_MS,
    format_duration_ms,
    human_duration_ms,
    iso,
)
from ledger.kinds import CooldownOrigin, CooldownScope, FailureKind

BACKOFF_STEPS_MS: tuple[int, ...] = (1 * MINUTE_MS, 5 * MINUTE_MS, 15 * MINUTE_MS, 1 * HOUR_MS)
"""R-POL-3: the n-th backoff (0-based) uses entry n; every later one uses the last."""
BACKOFF_JITTER = 0.2
TRANSPORT_STRIKE_WINDOW_MS = 15 * MINUTE_MS
"""Transport strikes on a model older than this are not counted (the store filters by it)."""
FAILURE_CAP = 5
OUTPUT_FAILURE_CAP = 3

FALLBACK_PERMITTED = "fallback permitted"
"""The action text that grants an immediate fallback (never after a follow-up: `was_follow_up`)."""
NO_FALLBACK = "no immediate fallback"


class FallbackConstraint(StrEnum):
    """Which immediate alternate the selector may offer after a failure (R-POL-4, R-SEL-4)."""

    OTHER_PROVIDER = "other_provider"
    OTHER_PROVIDER_OR_SIBLING = "other_provider_or_sibling"
    COMPATIBLE_WINDOW = "compatible_window"
    ALTERNATE_MODEL = "alternate_model"


_FALLBACK_DOC: Mapping[FallbackConstraint | None, str] = {
    FallbackConstraint.OTHER_PROVIDER: "another allowed provider",
    FallbackConstraint.OTHER_PROVIDER_OR_SIBLING: (
        "another provider, or an allowlisted same-provider model"
    ),
    FallbackConstraint.COMPATIBLE_WINDOW: "a compatible backup (one whose window fits, R-SEL-8)",
    FallbackConstraint.ALTERNATE_MODEL: "alternate model, an allowlisted sibling included",
    None: "no",
}


@dataclass(frozen=True)
class PolicyRow:
    """One row of the error policy table."""

    kind: FailureKind
    triggers: str
    cooldown_scope: CooldownScope | None = None
    cooldown_ms: int = 0
    cooldown_from_strike: int = 1
    probe_cap_ms: int | None = None
    """R-POL-10: the longest a failed probe's doubled cooldown gets (default 4 x the base)."""
    """The cooldown starts with this failure of the kind on the model within the strike window."""
    uses_hints: bool = False
    """A supplied Retry-After / reset time may lengthen (never shorten) the cooldown."""
    sets_backoff: bool = False
    pause_after: int | None = None
    """Pause the source when this many failures of this kind have been recorded."""
    fallback: FallbackConstraint | None = None
    fallback_needs_cooldown: bool = False
    """Fallback is permitted only when this failure put the model into cooldown."""
    source_doc: str = ""
    fallback_doc: str = ""

    def probe_cooldown_ms(self, failed_probes: int) -> int:
        """R-POL-10: the cooldown after `failed_probes` consecutive failed probes (0: the base),
        doubled per failed probe up to the row's cap."""
        cap = self.probe_cap_ms if self.probe_cap_ms is not None else 4 * self.cooldown_ms
        return min(self.cooldown_ms << min(max(failed_probes, 0), 32), max(cap, self.cooldown_ms))

    def cooldown_doc(self) -> str:
        """The cooldown column text."""
        if self.cooldown_scope is None:
            return "none"
        steps = [self.probe_cooldown_ms(n) for n in range(33)]
        ladder = " → ".join(format_duration_ms(ms) for ms in dict.fromkeys(steps))
        probe = f"; then one recovery probe, each failed probe doubling it ({ladder})"
        duration = format_duration_ms(self.cooldown_ms)
        if self.cooldown_from_strike > 1:
            window = format_duration_ms(TRANSPORT_STRIKE_WINDOW_MS)
            hint = (
                f"; a supplied `Retry-After` cools the {self.cooldown_scope} at least that long"
                if self.uses_hints
                else ""
            )
            return (
                f"none on the first; failure no. {self.cooldown_from_strike} on the same "
                f"{self.cooldown_scope} within {window} cools that {self.cooldown_scope} {duration}"
                + hint
                + probe
            )
        text = f"{self.cooldown_scope}, {duration}"
        if self.uses_hints:
            text += " or a later supplied `Retry-After` / reset"
        return text + probe

    def source_column(self) -> str:
        """The source column text."""
        parts = [self.source_doc] if self.source_doc else []
        parts.append("backoff (R-POL-3)" if self.sets_backoff else "no backoff of its own")
        if self.pause_after == 1:
            parts.append("**pause** with the reason")
        elif self.pause_after is not None:
            parts.append(f"**pause** after {self.pause_after}")
        return "; ".join(parts)

    def fallback_column(self) -> str:
        """The immediate-fallback column text."""
        if self.fallback_doc:
            return self.fallback_doc
        text = _FALLBACK_DOC[self.fallback]
        return f"{text}, only once the model is cooling" if self.fallback_needs_cooldown else text


_ROWS = (
    PolicyRow(
        FailureKind.AUTH,
        "HTTP 401, 403",
        CooldownScope.PROVIDER,
        15 * MINUTE_MS,
        fallback=FallbackConstraint.OTHER_PROVIDER,
    ),
    PolicyRow(
        FailureKind.QUOTA,
        "HTTP 402; a known quota/billing code (e.g. `insufficient_quota`) on any status; a known "
        "account phrase (Anthropic's 400 saying the credit balance is too low)",
        CooldownScope.PROVIDER,
        1 * HOUR_MS,
        uses_hints=True,
        fallback=FallbackConstraint.OTHER_PROVIDER,
    ),
    PolicyRow(
        FailureKind.RATE_LIMIT,
        "HTTP 429 without a known quota code",
        CooldownScope.MODEL,
        60 * SECOND_MS,
        uses_hints=True,
        fallback=FallbackConstraint.OTHER_PROVIDER_OR_SIBLING,
    ),
    PolicyRow(
        FailureKind.TRANSPORT,
        "HTTP 408, 5xx (incl. 529), timeout, connection/network error, stream cut",
        CooldownScope.MODEL,
        1 * MINUTE_MS,
        cooldown_from_strike=2,
        probe_cap_ms=15 * MINUTE_MS,
        uses_hints=True,
        sets_backoff=True,
        fallback=FallbackConstraint.OTHER_PROVIDER,
        fallback_needs_cooldown=True,
    ),
    PolicyRow(
        FailureKind.REQUEST_REJECTED,
        "context overflow (known codes, or a `context_limit` stop), HTTP 400, 404, 413, 422",
        CooldownScope.MODEL,
        1 * HOUR_MS,
        fallback=FallbackConstraint.COMPATIBLE_WINDOW,
    ),
    PolicyRow(
        FailureKind.INVALID_OUTPUT,
        "invalid JSON, output truncated (`length` stop), broken output contract (with a reason)",
        pause_after=OUTPUT_FAILURE_CAP,
        fallback=FallbackConstraint.ALTERNATE_MODEL,
        source_doc="1st: one corrective prompt on the same model naming the rule; "
        "2nd: an alternate model",
        fallback_doc="alternate model from the 2nd output failure, an allowlisted sibling included",
    ),
    PolicyRow(
        FailureKind.SAFETY,
        "recognised safety refusal (`content_filter`, `refusal` stop); a known safety or "
        "content-policy code on any 4xx (`content_policy_violation`, Azure `content_filter` / "
        "`ResponsibleAIPolicyViolation`, Gemini `SAFETY` / `PROHIBITED_CONTENT` / `SPII` / "
        "`BLOCKLIST` blocks)",
        pause_after=1,
        fallback_doc="**never** (no fallback to get around a guard)",
    ),
    PolicyRow(
        FailureKind.WRITE_REJECTED,
        "an unsafe or unauthorised write; the store refusing on its own authority (with a reason)",
        pause_after=1,
        fallback_doc="**never** (no fallback to get around a guard)",
    ),
    PolicyRow(
        FailureKind.STALE,
        "the result was overtaken by a newer change",
        sets_backoff=True,
        source_doc="counts one reserved call and one failure",
    ),
    PolicyRow(
        FailureKind.CANCELLED,
        "cancellation, shutdown, reload",
        source_doc="lease released, **no failure added**; the reservation still counts",
    ),
    PolicyRow(
        FailureKind.UNKNOWN,
        "anything else",
        sets_backoff=True,
        source_doc="generic bounded retry; no guessing from prose",
    ),
)

POLICY_TABLE: Mapping[FailureKind, PolicyRow] = MappingProxyType({row.kind: row for row in _ROWS})


@dataclass(frozen=True)
class InteractivePace:
    """R-GW-4: one gateway request's attempts run at interactive pace (None: the queue's pace).

    `attempts_left` counts the attempts the request may still make after this one
    (`gateway.maxAttemptsPerRequest` bounds them); `retried` says this model already had its one
    same-model retry in the request."""

    max_retry_wait_ms: int = 3000
    retry_backoff_ms: int = 500
    attempts_left: int = 3
    retried: bool = False


@dataclass(frozen=True)
class FailureContext:
    """What the store reads inside the settle transaction before deciding."""

    classification: Classification
    model_key: str
    now_ms: int
    recent_transport_strikes: int
    failures: int
    output_failures: int
    backoff_steps: int
    correction_used: bool
    side_effects: bool = False
    # this attempt was its queue item's one immediate follow-up (R-POL-4): it permits none itself
    was_follow_up: bool = False
    # an override (R-RES-9) is one explicit attempt outside any queue item: it permits none either
    override: bool = False
    existing_cooldowns: Mapping[tuple[CooldownScope, str], int] = field(default_factory=dict)
    # the recovery probes this attempt held (R-POL-9): target -> consecutive failed probes before
    probe_streaks: Mapping[tuple[CooldownScope, str], int] = field(default_factory=dict)
    # R-GW-4: the gateway's interactive pace (None: the queue's pace, R-POL-4)
    pace: InteractivePace | None = None


@dataclass(frozen=True)
class CooldownAction:
    """A cooldown to write; the store keeps max(existing, until_ms)."""

    scope: CooldownScope
    target: str
    until_ms: int
    kind: FailureKind
    origin: CooldownOrigin


@dataclass(frozen=True)
class Decision:
    """Everything the settle transaction must write after one failure."""

    kind: FailureKind
    subkind: str
    reason: str | None
    cooldowns: tuple[CooldownAction, ...]
    backoff_until_ms: int | None
    pause_reason: str | None
    counts_failure: bool
    counts_output_failure: bool
    transport_strike: bool
    use_correction: bool
    fallback: FallbackConstraint | None
    actions: tuple[str, ...]
    retry_after_ms: int | None = None
    """Interactive pace only: one retry on the same model is permitted after this wait."""


def backoff_ms(step: int, jitter: Callable[[], float]) -> int:
    """R-POL-3: 1 min, 5 min, 15 min, then 1 h, each plus up to 20 % positive jitter."""
    base = BACKOFF_STEPS_MS[min(max(step, 0), len(BACKOFF_STEPS_MS) - 1)]
    fraction = jitter()
    if not math.isfinite(fraction) or fraction < 0:
        fraction = 0.0
    fraction = min(fraction, 1.0)
    return base + int(base * BACKOFF_JITTER * fraction)


def decide(ctx: FailureContext, jitter: Callable[[], float]) -> Decision:
    """Apply the error policy table to one failure (R-POL-1..7)."""
    c = ctx.classification
    row = POLICY_TABLE[c.kind]
    if c.kind is FailureKind.CANCELLED:
        return Decision(
            c.kind,
            c.subkind,
            c.reason,
            (),
            None,
            None,
            False,
            False,
            False,
            False,
            None,
            ("cancelled: lease released, no failure added",),
        )
    actions: list[str] = []
    cooldowns = _cooldowns(ctx, row, actions)
    pace = ctx.pace

    backoff_until = None
    if row.sets_backoff and pace is None:
        delay = backoff_ms(ctx.backoff_steps, jitter)
        backoff_until = ctx.now_ms + delay
        actions.append(
            f"source backoff until {iso(backoff_until)} "
            f"({human_duration_ms(delay)}, backoff {ctx.backoff_steps + 1})"
        )

    failures = ctx.failures + 1
    output_failures = ctx.output_failures + (c.kind is FailureKind.INVALID_OUTPUT)
    actions.append(f"failure {failures} of {FAILURE_CAP} counted")
    if c.kind is FailureKind.INVALID_OUTPUT:
        actions.append(f"output failure {output_failures} of {OUTPUT_FAILURE_CAP} counted")
    if c.kind is FailureKind.TRANSPORT:
        actions.append(f"transport strike recorded on {ctx.model_key}")

    pause = _pause_reason(c, row, output_failures, failures)
    use_correction = False
    fallback = row.fallback
    if row.fallback_needs_cooldown and not cooldowns:
        fallback = None
    first_output_failure = c.kind is FailureKind.INVALID_OUTPUT and ctx.output_failures == 0
    if first_output_failure and not ctx.correction_used:
        use_correction, fallback = True, None
    if pause is not None:
        use_correction, fallback = False, None
        actions.append(f"source paused: {pause}")
    retry = None
    if pace is not None and pause is None:
        use_correction = False  # a passthrough request has no output contract to correct
        retry = _interactive_retry(ctx, pace, jitter)
        if retry is not None:
            fallback = None
        if pace.attempts_left <= 0:
            retry, fallback = None, None
            actions.append("no further attempt: the request used its attempts (R-GW-4)")
    if ctx.side_effects and (use_correction or fallback is not None or retry is not None):
        use_correction, fallback, retry = False, None, None
        actions.append("no fallback or correction: the attempt caused side effects (R-POL-7)")
    if pace is None and (ctx.was_follow_up or ctx.override) and (
        use_correction or fallback is not None
    ):
        # a granted correction stays owed to the next queue item; nothing is immediate any more
        fallback = None
        actions.append(
            "no immediate follow-up: an override is one explicit attempt"
            if ctx.override
            else "no immediate follow-up: this attempt was the item's one follow-up"
        )
    if ctx.override and retry is not None:
        retry = None
    if use_correction:
        actions.append("next attempt: one corrective prompt on the same model")
    if retry is not None:
        actions.append(f"interactive retry on the same model after {retry} ms (R-GW-4)")
    actions.append(f"{FALLBACK_PERMITTED}: {fallback}" if fallback else NO_FALLBACK)

    return Decision(
        kind=c.kind,
        subkind=c.subkind,
        reason=c.reason,
        cooldowns=cooldowns,
        backoff_until_ms=backoff_until,
        pause_reason=pause,
        counts_failure=True,
        counts_output_failure=c.kind is FailureKind.INVALID_OUTPUT,
        transport_strike=c.kind is FailureKind.TRANSPORT,
        use_correction=use_correction,
        fallback=fallback,
        actions=tuple(actions),
        retry_after_ms=retry,
    )


def _interactive_retry(
    ctx: FailureContext, pace: InteractivePace, jitter: Callable[[], float]
) -> int | None:
    """R-GW-4: the wait before the one same-model retry, or None when the table acts at once.

    A `transport` failure, or a `rate_limit` whose supplied wait is at most maxRetryWaitMs, is
    retried once on the same model: after the supplied wait, else after a jittered backoff of at
    most retryBackoffMs (a 429 without a wait is not retried: its wait is unknown). Never after
    the model's one retry in this request, nor after a failed recovery probe (one call tests the
    target, not the fleet)."""
    c = ctx.classification
    if c.kind not in (FailureKind.TRANSPORT, FailureKind.RATE_LIMIT) or pace.retried:
        return None
    if ctx.probe_streaks:
        return None
    hint = _hint_until(c, ctx.now_ms)
    if hint is not None:
        wait = max(0, hint - ctx.now_ms)
    elif c.kind is FailureKind.TRANSPORT:
        fraction = jitter()
        fraction = min(max(fraction, 0.0), 1.0) if math.isfinite(fraction) else 0.0
        wait = int(pace.retry_backoff_ms * (0.5 + 0.5 * fraction))
    else:
        return None
    return wait if wait <= pace.max_retry_wait_ms else None


def _cooldowns(
    ctx: FailureContext, row: PolicyRow, actions: list[str]
) -> tuple[CooldownAction, ...]:
    if row.cooldown_scope is None:
        return ()
    hint = _hint_until(ctx.classification, ctx.now_ms) if row.uses_hints else None
    if hint is not None and hint <= ctx.now_ms:
        hint = None  # "retry now" asks for no cooldown
    if row.cooldown_scope is CooldownScope.PROVIDER:
        target = split_model_key(ctx.model_key)[0]
    else:
        split_model_key(ctx.model_key)  # validates the key
        target = ctx.model_key
    failed_probes = ctx.probe_streaks.get((row.cooldown_scope, target))
    # a failed probe always cools its target again (R-POL-9), whatever the strike count
    strike_cooldown = (
        failed_probes is not None or ctx.recent_transport_strikes + 1 >= row.cooldown_from_strike
    )
    if not strike_cooldown and hint is None:
        actions.append("no cooldown: first transport failure on this model within 15m")
        return ()
    cooldown_ms = row.probe_cooldown_ms(0 if failed_probes is None else failed_probes + 1)
    if failed_probes is not None:
        actions.append(
            f"recovery probe failed ({failed_probes + 1} in a row): "
            f"cooldown {format_duration_ms(cooldown_ms)} (R-POL-10)"
        )
    # Before the strike threshold only the provider's own asked delay cools the model (5xx/529).
    base_until = ctx.now_ms + cooldown_ms if strike_cooldown else ctx.now_ms
    until, origin = base_until, CooldownOrigin.POLICY
    if hint is not None and (hint > base_until or not strike_cooldown):
        until, origin = hint, CooldownOrigin.HINT
    existing = ctx.existing_cooldowns.get((row.cooldown_scope, target))
    text = (
        f"cooldown {row.cooldown_scope} {target} until {iso(until)} "
        f"({human_duration_ms(until - ctx.now_ms)}, {origin})"
    )
    if existing is not None and existing >= until:
        text += f"; kept (longer existing until {iso(existing)})"
    actions.append(text)
    return (CooldownAction(row.cooldown_scope, target, until, row.kind, origin),)


def _hint_until(c: Classification, now_ms: int) -> int | None:
    """The latest valid supplied hint as an absolute time; invalid hints are ignored."""
    candidates = []
    if c.retry_after_ms is not None and 0 <= c.retry_after_ms <= MAX_HINT_MS:
        candidates.append(now_ms + c.retry_after_ms)
    if c.reset_at_ms is not None and now_ms < c.reset_at_ms <= now_ms + MAX_HINT_MS:
        candidates.append(c.reset_at_ms)
    return max(candidates) if candidates else None


def _pause_reason(
    c: Classification, row: PolicyRow, kind_failures: int, failures: int
) -> str | None:
    if row.pause_after == 1:
        return f"{c.kind}:{c.reason}" if c.reason else str(c.kind)
    if row.pause_after is not None and kind_failures >= row.pause_after:
        return "output_failures"
    if failures >= FAILURE_CAP:
        return "failure_cap"
    return None


def markdown_table() -> str:
    """The error policy table rendered from POLICY_TABLE, for the README."""
    lines = [
        "| kind | triggers | cooldown | source | immediate fallback |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in POLICY_TABLE.values():
        cells = (
            f"`{row.kind}`",
            row.triggers,
            row.cooldown_doc(),
            row.source_column(),
            row.fallback_column(),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
