"""The timeline picture of a simulation (R-SIM-1): calls per minute per model, cooldown bands.

One panel per run (current above, candidate below), sharing the time axis: a line per model of
the calls it received in each minute, and under it one band row per cooled target spanning each
cooldown (model cooldowns in the model's colour, provider cooldowns in grey). The time axis is
labelled under each panel with the time since the start, in the one duration format of the CLI
and the page (`+1h30m`). A standalone SVG with no script and no external asset.

Invariant: pure text rendering of the runs' own history; the same runs give the same bytes.
"""

from __future__ import annotations

from collections import Counter
from html import escape

from ledger.clock import human_duration_ms, iso
from ledger.simulate.runner import Comparison, RunRecord

WIDTH = 960
PLOT_LEFT = 70
PLOT_RIGHT = 180
CHART_H = 160
BAND_H = 10
MINUTE_MS = 60_000
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#7f7f7f")
PROVIDER_GREY = "#999999"
TICK_STEPS_MS = tuple(m * MINUTE_MS for m in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440,
                                              2880, 10080))
MAX_TICKS = 8


def time_ticks(span_ms: int) -> list[int]:
    """Offsets from the start for the time axis labels: the finest round step that gives at
    most MAX_TICKS intervals over `span_ms` (the start included)."""
    step = next((s for s in TICK_STEPS_MS if span_ms / s <= MAX_TICKS), TICK_STEPS_MS[-1])
    while span_ms / step > MAX_TICKS:
        step *= 2
    return list(range(0, span_ms + 1, step))


def render_svg(result: Comparison) -> str:
    """The whole picture as SVG text."""
    start = result.workload.start_ms
    runs = [("current", result.current)]
    if result.candidate is not None:
        runs.append(("candidate", result.candidate))
    end = _last_activity(result, [r for _, r in runs])
    models = sorted({a.model for _, r in runs for a in r.history.attempts})
    colour = {m: COLOURS[i % len(COLOURS)] for i, m in enumerate(models)}
    peak = max([1, *(_peak(r, start) for _, r in runs)])
    parts: list[str] = []
    y = 30
    for name, run in runs:
        y = _panel(parts, name, run, start, end, y, peak, colour)
    height = y + 20 + 16 * len(models)
    for i, model in enumerate(models):
        ly = y + 10 + 16 * i
        parts.append(f'<rect x="{PLOT_LEFT}" y="{ly}" width="12" height="3" '
                     f'fill="{colour[model]}"/>')
        parts.append(f'<text x="{PLOT_LEFT + 18}" y="{ly + 5}">{escape(model)}</text>')
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">')
    title = (f'<text x="{PLOT_LEFT}" y="16" font-size="13">calls per minute per model, '
             f'{escape(iso(start) or "")} to {escape(iso(end) or "")}</text>')
    return "\n".join([head, title, *parts, "</svg>", ""])


def _last_activity(result: Comparison, runs: list[RunRecord]) -> int:
    """Where the time axis ends: the last call, cooldown end or arrival (plus a minute), never
    past the simulation's end: the hours a drained queue sat idle are not drawn."""
    moments = [a.at_ms for a in result.workload.arrivals]
    for run in runs:
        moments.extend(a.created_ms for a in run.history.attempts)
        moments.extend(b.until_ms for b in run.bands.values())
    last = max(moments, default=result.workload.start_ms) + MINUTE_MS
    return max(result.workload.start_ms + MINUTE_MS, min(last, result.end_ms))


def _per_minute(run: RunRecord, start: int) -> dict[str, Counter[int]]:
    counts: dict[str, Counter[int]] = {}
    for attempt in run.history.attempts:
        counts.setdefault(attempt.model, Counter())[(attempt.created_ms - start) // MINUTE_MS] += 1
    return counts


def _peak(run: RunRecord, start: int) -> int:
    return max([0, *(max(c.values()) for c in _per_minute(run, start).values())])


def _panel(parts: list[str], name: str, run: RunRecord, start: int, end: int, top: int,
           peak: int, colour: dict[str, str]) -> int:
    plot_w = WIDTH - PLOT_LEFT - PLOT_RIGHT
    minutes = max(1, (end - start + MINUTE_MS - 1) // MINUTE_MS)

    def x_of(ms: int) -> float:
        return PLOT_LEFT + plot_w * max(0, min(ms - start, end - start)) / (end - start)

    base = top + CHART_H
    parts.append(f'<text x="{PLOT_LEFT}" y="{top - 4}" font-weight="bold">{escape(name)}</text>')
    parts.append(f'<rect x="{PLOT_LEFT}" y="{top}" width="{plot_w}" height="{CHART_H}" '
                 f'fill="none" stroke="#cccccc"/>')
    parts.append(f'<text x="{PLOT_LEFT - 6}" y="{top + 10}" text-anchor="end">{peak}/min</text>')
    parts.append(f'<text x="{PLOT_LEFT - 6}" y="{base}" text-anchor="end">0</text>')
    for model, counts in sorted(_per_minute(run, start).items()):
        points = " ".join(
            f"{PLOT_LEFT + plot_w * (m + 0.5) / minutes:.1f},"
            f"{base - CHART_H * counts.get(m, 0) / peak:.1f}"
            for m in range(minutes)
        )
        parts.append(f'<polyline fill="none" stroke="{colour[model]}" stroke-width="1.2" '
                     f'points="{points}"><title>{escape(model)}</title></polyline>')
    for offset in time_ticks(end - start):
        x = x_of(start + offset)
        parts.append(f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}" '
                     f'stroke="#888888"/>')
        label = "0" if offset == 0 else "+" + human_duration_ms(offset)
        parts.append(f'<text x="{x:.1f}" y="{base + 15}" text-anchor="middle" '
                     f'class="tick">{label}</text>')
    targets = sorted({(b.scope, b.target) for b in run.bands.values()})
    row_of = {t: i for i, t in enumerate(targets)}
    band_top = base + 22
    for (scope, target), i in row_of.items():
        parts.append(f'<text x="{WIDTH - PLOT_RIGHT + 6}" y="{band_top + i * (BAND_H + 2) + 9}">'
                     f'{escape(scope)} {escape(target)}</text>')
    for key in sorted(run.bands):
        band = run.bands[key]
        i = row_of[(band.scope, band.target)]
        fill = colour.get(band.target, PROVIDER_GREY) if band.scope == "model" else PROVIDER_GREY
        x0, x1 = x_of(band.created_ms), x_of(band.until_ms)
        parts.append(
            f'<rect x="{x0:.1f}" y="{band_top + i * (BAND_H + 2)}" width="{max(1.0, x1 - x0):.1f}" '
            f'height="{BAND_H}" fill="{fill}" fill-opacity="0.45"><title>{escape(band.kind)} '
            f'{escape(band.target)} {escape(iso(band.created_ms) or "")} to '
            f'{escape(iso(band.until_ms) or "")}</title></rect>'
        )
    return band_top + len(targets) * (BAND_H + 2) + 40
