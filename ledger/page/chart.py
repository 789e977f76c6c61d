"""The last 24 h per hour as an SVG chart (R-SRV-8): geometry only, computed from the status
document's `hours_24`; the template draws it. Pure: hours in, shapes out.

Calls per hour stack (succeeded, failed by kind, other outcomes) on the left axis; the estimated
cost per hour is a step line (flat across each hour, no ramp between hours) on its own right axis,
and each axis is titled. Every failure kind of the policy table has a fill pattern of its own (no
two kinds share a pattern, whatever the colours) as well as a colour, and every bar carries a
title with its numbers, so colour is never the only signal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ledger.kinds import FailureKind

WIDTH = 720
HEIGHT = 260
LEFT, RIGHT, TOP, BOTTOM = 50, 84, 34, 34


@dataclass(frozen=True)
class Pattern:
    """A fill pattern: an 8x8 tile of `shapes` (SVG markup drawn in the foreground class) over a
    background of `tone` (bad, warn or alt), optionally rotated. The geometry (`transform`,
    `shapes`) alone tells every kind apart; the tone is a second signal."""

    transform: str
    shapes: str
    tone: str


# One pattern per failure kind of the policy table, in FailureKind order; a kind outside the
# table (an old database) is drawn as `unknown`.
PATTERNS: tuple[Pattern, ...] = (
    Pattern("rotate(45)", '<line class="pfg" x1="0" y1="0" x2="0" y2="8"/>', "bad"),  # auth
    Pattern("", '<circle class="pdot" cx="4" cy="4" r="1.6"/>', "warn"),  # quota
    Pattern("rotate(-45)", '<line class="pfg" x1="0" y1="0" x2="0" y2="8"/>', "bad"),  # rate
    Pattern("", '<line class="pfg" x1="0" y1="4" x2="8" y2="4"/>', "alt"),  # transport
    Pattern("", '<path class="pfg" d="M0 0L8 8M8 0L0 8"/>', "warn"),  # request_rejected
    Pattern("", '<line class="pfg" x1="4" y1="0" x2="4" y2="8"/>', "bad"),  # invalid_output
    Pattern("", '<path class="pfg" d="M0 4H8M4 0V8"/>', "alt"),  # safety
    Pattern("", '<rect class="pdot" width="4" height="4"/><rect class="pdot" x="4" y="4" '
            'width="4" height="4"/>', "bad"),  # write_rejected
    Pattern("", '<circle class="pdot" cx="2" cy="2" r="1"/><circle class="pdot" cx="6" cy="6" '
            'r="1"/>', "alt"),  # stale
    Pattern("", '<path class="pfg" d="M0 6L2 2L4 6L6 2L8 6"/>', "warn"),  # cancelled
    Pattern("", '<rect class="pdot" x="1" y="1" width="6" height="6"/>', "alt"),  # unknown
)
KIND_PATTERN: dict[str, int] = {kind.value: i for i, kind in enumerate(FailureKind)}
assert len(PATTERNS) == len(KIND_PATTERN), "every failure kind needs a pattern of its own"


def pattern_of(kind: str) -> int:
    """The pattern index of a failure kind (a kind the table does not know draws as unknown)."""
    return KIND_PATTERN.get(kind, KIND_PATTERN[FailureKind.UNKNOWN.value])


@dataclass(frozen=True)
class Segment:
    """One stacked piece of an hour's bar."""

    x: float
    y: float
    width: float
    height: float
    css: str  # the series class: ok, other, or fail-N (N: the kind's pattern)


@dataclass(frozen=True)
class Bar:
    """One hour: its stacked segments and the text shown on hover and to screen readers."""

    segments: tuple[Segment, ...]
    x: float
    width: float
    title: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bars: tuple[Bar, ...]
    cost_points: str  # an SVG polyline: a step per hour
    calls_max: int
    cost_max: float
    cost_mid: float  # the right axis' middle tick
    ticks: tuple[tuple[float, str], ...]  # x position, label
    kinds: tuple[tuple[str, str], ...]  # failure kind, its series class
    plot: tuple[float, float, float, float]  # left, top, right, bottom


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value` (1 when nothing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def failure_kinds(hours: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """Every failure kind of the window, in name order, with its series class."""
    kinds = sorted({kind for h in hours for kind in h["failed"]})
    return tuple((kind, f"fail-{pattern_of(kind)}") for kind in kinds)


def build_chart(hours: list[dict[str, Any]]) -> Chart:
    """The chart of `hours_24` (oldest first)."""
    kinds = failure_kinds(hours)
    css = dict(kinds)
    calls_max = int(nice_ceiling(max((h["attempts"] for h in hours), default=0)))
    cost_max = nice_ceiling(max((h["spent_usd"] for h in hours), default=0.0))
    left, top, right, bottom = LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM
    span = (right - left) / max(1, len(hours))
    scale = (bottom - top) / calls_max
    bars: list[Bar] = []
    points: list[str] = []
    for i, hour in enumerate(hours):
        x = left + i * span + span * 0.15
        width = span * 0.7
        y = float(bottom)
        segments: list[Segment] = []
        series = [("ok", hour["succeeded"])]
        series += [(css[kind], n) for kind, n in hour["failed"].items()]
        series.append(("other", hour["other"]))
        for name, count in series:
            if count <= 0:
                continue
            height = count * scale
            y -= height
            segments.append(
                Segment(round(x, 2), round(y, 2), round(width, 2), round(height, 2), name)
            )
        failed = sum(hour["failed"].values())
        kinds_text = ", ".join(f"{kind} {n}" for kind, n in hour["failed"].items())
        title = (
            f"{hour['start'][11:16]} to {hour['end'][11:16]} UTC: {hour['attempts']} calls, "
            f"{hour['succeeded']} succeeded, {failed} failed"
            + (f" ({kinds_text})" if kinds_text else "")
            + (f", {hour['other']} open or cancelled" if hour["other"] else "")
            + f", ${hour['spent_usd']:.4f}"
        )
        bars.append(Bar(tuple(segments), round(left + i * span, 2), round(span, 2), title))
        cy = round(bottom - hour["spent_usd"] / cost_max * (bottom - top), 2)
        points.append(f"{round(left + i * span, 2)},{cy} {round(left + (i + 1) * span, 2)},{cy}")
    n = len(hours)
    ticks = tuple(
        (round(left + i * span, 2), "now" if i == n else f"-{n - i}h") for i in range(0, n + 1, 6)
    )
    return Chart(
        WIDTH,
        HEIGHT,
        tuple(bars),
        " ".join(points),
        calls_max,
        cost_max,
        cost_max / 2,
        ticks,
        kinds,
        (left, top, right, bottom),
    )
