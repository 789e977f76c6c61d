"""The last 24 h per hour as an SVG chart (R-SRV-8): geometry only, computed from the status
document's `hours_24`; the template draws it. Pure: hours in, shapes out.

Calls stack per hour (succeeded, failed by kind, other outcomes) on the left axis; cost is a line
on its own right axis. Each failure kind has a fill pattern as well as a colour, and every bar
carries a title with its numbers, so colour is never the only signal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

WIDTH = 720
HEIGHT = 240
LEFT, RIGHT, TOP, BOTTOM = 44, 76, 14, 28
PATTERNS = 6  # fill patterns cycle after this many failure kinds


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
    cost_points: str  # an SVG polyline
    calls_max: int
    cost_max: float
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
    return tuple((kind, f"fail-{i % PATTERNS}") for i, kind in enumerate(kinds))


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
        cy = bottom - hour["spent_usd"] / cost_max * (bottom - top)
        points.append(f"{round(left + (i + 0.5) * span, 2)},{round(cy, 2)}")
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
        ticks,
        kinds,
        (left, top, right, bottom),
    )
