"""R-SRV-8 (issue 22): the status page in a real browser — Debian's chromium driven headless by
playwright (no browser download). The page of the demo's ledger: no console error, no request
leaving its origin, the numbers of `status --json`, a countdown that moves, refresh in place
(served over real HTTP on 127.0.0.1 with the strict CSP the service sends), usable at 390 px and
at 200 % zoom, readable with scripts off, and screenshots that are not blank.

Skipped only when chromium is absent locally; under CI (CI=true) a missing chromium fails.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ledger.page import render_page
from tests.support.browser import TOKEN, browser, ledger_cli, open_page
from tests.support.serving import running

ARTIFACTS = Path(os.environ.get("LEDGER_TEST_ARTIFACTS", "")) if os.environ.get(
    "LEDGER_TEST_ARTIFACTS"
) else None

__all__ = ["browser"]  # the module-scoped fixture, shared with test_page_browser_scopes.py

pytestmark = pytest.mark.timeout(300)


@dataclass
class Demo:
    home: Path
    doc: dict[str, Any]
    page: Path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    home = tmp_path_factory.mktemp("page") / "demo"
    ledger_cli(home, "demo", "--home", str(home))
    page = home.parent / "status.html"
    doc = json.loads(ledger_cli(home, "status", "--json"))
    ledger_cli(home, "status", "--html", str(page))
    return Demo(home, doc, page)


@contextmanager
def page_server(home: Path) -> Iterator[str]:
    """A real `ledger serve` on 127.0.0.1 (the page at `/`, its assets, the strict CSP header);
    the browser context sends the bearer token (TCP always needs it)."""
    with running(home, "--listen", "127.0.0.1:0", env={"LEDGER_TOKEN": TOKEN}) as served:
        assert served.url is not None
        yield served.url + "/"


def seconds_left(text: str) -> int:
    """`1h5m`, `4m9s`, `12s`, `2d3h` as seconds."""
    total = 0
    for value, unit in re.findall(r"(\d+)([dhms])", text):
        total += int(value) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[unit]
    return total


def pixel_variance(browser: Any, png: bytes) -> float:
    """The variance of the luminance of a PNG's pixels, measured by the browser's canvas."""
    page = browser.new_page()
    data = "data:image/png;base64," + base64.b64encode(png).decode()
    value = page.evaluate(
        """async (src) => {
            const img = new Image(); img.src = src; await img.decode();
            const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
            const g = c.getContext('2d'); g.drawImage(img, 0, 0);
            const d = g.getImageData(0, 0, c.width, c.height).data;
            let n = 0, sum = 0, sq = 0;
            for (let i = 0; i < d.length; i += 4) {
                const y = 0.299 * d[i] + 0.587 * d[i + 1] + 0.114 * d[i + 2];
                n++; sum += y; sq += y * y;
            }
            const mean = sum / n; return sq / n - mean * mean;
        }""",
        data,
    )
    page.close()
    return float(value)


def test_r_srv_8_file_loads_offline_without_error_or_outside_request(
    demo: Demo, browser: Any
) -> None:
    w = open_page(browser, demo.page.as_uri())
    w.page.wait_for_timeout(300)
    assert w.problems == []
    assert w.requests == [demo.page.as_uri()]  # the file alone: nothing else is fetched
    assert w.page.title() == "ledger status"


def test_r_srv_8_served_page_strict_csp_same_origin_only(demo: Demo, browser: Any) -> None:
    with page_server(demo.home) as url:
        w = open_page(browser, url, timezone="Asia/Tokyo")
        w.page.wait_for_timeout(300)
        assert w.problems == []  # a CSP violation is a console error
        assert set(w.requests) == {url, url + "page.css",
                                            url + "page.js"}
        # the script ran under the CSP: times are in the viewer's zone, UTC on hover
        first = w.page.locator("header time")
        assert first.get_attribute("title").endswith(" UTC")
        assert "UTC" not in first.inner_text()  # rewritten by page.js: it ran


def test_r_srv_8_numbers_equal_status_json(demo: Demo, browser: Any) -> None:
    doc = demo.doc
    page = open_page(browser, demo.page.as_uri()).page
    h, d = doc["hourly"], doc["daily"]
    budgets = page.locator("#budgets .bar-text").all_inner_texts()
    assert budgets[0] == f"{h['used']} / {h['limit']} calls"
    assert budgets[1].startswith(f"${d['spent_usd']:,.4f}")
    if d["ceiling_usd"] is not None:
        assert f"${d['ceiling_usd']:,.4f}" in budgets[1]
    assert f"{d['unknown_cost_attempts']} of unknown cost" in page.inner_text("#budgets")
    rows = page.locator("#cooldowns tbody tr")
    assert rows.count() == len(doc["cooldowns"]) > 0
    for i, c in enumerate(doc["cooldowns"]):
        cells = rows.nth(i).locator("td").all_inner_texts()
        assert (cells[0], cells[1], cells[4], cells[5]) == (
            c["target"], c["scope"], c["kind"], c["origin"])
        assert rows.nth(i).locator("time").get_attribute("datetime") == c["until"]
    hours = page.locator(".hours-table tbody tr")
    assert hours.count() == 24
    for i, x in enumerate(doc["hours_24"]):
        cells = hours.nth(i).locator("td").all_text_contents()  # in a closed <details>
        assert int(cells[1]) == x["attempts"]
        assert int(cells[2]) == x["succeeded"]
        assert cells[5] == f"${x['spent_usd']:,.4f}"
    assert sum(x["attempts"] for x in doc["hours_24"]) == d["attempts"]
    failovers = page.locator("#failovers tbody tr")
    assert failovers.count() == len(doc["failovers"]) > 0
    for i, f in enumerate(doc["failovers"]):
        cells = failovers.nth(i).locator("td").all_inner_texts()
        assert cells[1:] == [f["source"], f"{f['from']} → {f['to']}", f["kind"] or "-",
                             f["status"]]
    paused = [s for s in doc["sources"]["list"] if s["state"] == "paused"]
    commands = page.locator("#paused .cmd code").all_inner_texts()
    assert commands == [f"ledger --home {demo.home} source resume {s['id']}" for s in paused]
    assert len(commands) > 0
    fingerprints = page.locator("#writers li code").all_inner_texts()
    assert fingerprints == [w["fingerprint"] for w in doc["policy"]["writers"]]


def test_r_srv_8_file_countdown_moves_in_the_page_clock(demo: Demo, browser: Any) -> None:
    start = 1_900_000_000_000
    page = open_page(browser, demo.page.as_uri(), clock_ms=start).page
    span = page.locator("#cooldowns .left").last  # the longest cooldown
    before = seconds_left(span.inner_text())
    page.clock.run_for(125_000)
    after = seconds_left(span.inner_text())
    assert before > 0
    assert before - after >= 60  # `1h 05m` shows minutes only, so allow its rounding


def test_r_srv_8_served_page_refreshes_in_place_keeping_scroll(
    demo: Demo, browser: Any, tmp_path: Path
) -> None:
    with page_server(demo.home) as url:
        w = open_page(browser, url, width=390, height=844, clock_ms=1_900_000_000_000)
        page = w.page
        assert page.locator("#cooldowns tr", has_text="manual").count() == 0
        page.evaluate("window.scrollTo(0, document.body.scrollHeight / 2)")
        y = page.evaluate("window.scrollY")
        assert y > 0
        ledger_cli(demo.home, "cooldown", "set", "bolt", "3h")
        # One refresh goes through; the later ones wait. Each refresh sets the countdown's clock
        # to the server's own time, which the page's faked clock does not move, so a refresh
        # landing during the 65 s below would put the new countdown back at 3h (a race).
        passed: list[Any] = []
        held: list[Any] = []

        def one_refresh(route: Any) -> None:
            if passed:
                held.append(route)
            else:
                passed.append(route)
                route.continue_()

        page.route(url, one_refresh)
        page.clock.run_for(6_000)  # the refresh interval passes: one fetch of the page
        page.wait_for_function(
            "(n) => document.querySelectorAll('#cooldowns .left').length > n",
            arg=len(demo.doc["cooldowns"]),
        )
        manual = page.locator("#cooldowns tr", has_text="manual").locator(".left")
        first = seconds_left(manual.inner_text())
        assert 3 * 3600 - 120 <= first <= 3 * 3600
        page.clock.run_for(65_000)
        assert seconds_left(manual.inner_text()) <= first - 60  # the new countdown moves too
        assert page.evaluate("window.scrollY") == y
        assert w.problems == []
        assert len(passed) == 1
        assert len(held) >= 10  # the refreshes of the 65 s waited
        page.unroute(url)  # the held refreshes go on
        ledger_cli(demo.home, "cooldown", "clear", "bolt")


def test_r_srv_8_keyboard_focus_survives_a_refresh(demo: Demo, browser: Any) -> None:
    """A keyboard user on the cooldowns table keeps their place when the page refreshes in
    place (was: focus fell back to the document body at every refresh)."""
    with page_server(demo.home) as url:
        w = open_page(browser, url, width=1280, height=800, clock_ms=1_900_000_000_000)
        page = w.page
        page.focus("#cooldowns .scroll")
        note = page.locator("#refresh-note").inner_text()
        page.clock.run_for(6_000)  # the refresh interval passes: one fetch of the page
        page.wait_for_function(
            "(before) => document.getElementById('refresh-note').textContent !== before",
            arg=note,
        )
        assert page.locator("#refresh-note").inner_text().startswith("refreshed")
        focused = page.evaluate(
            "() => [document.activeElement.closest('section') &&"
            " document.activeElement.closest('section').id,"
            " document.activeElement.classList.contains('scroll')]"
        )
        assert focused == ["cooldowns", True]
        assert w.problems == []


@pytest.mark.parametrize(("width", "height"), [(1280, 800), (390, 844)])
def test_r_srv_8_screenshots_are_not_blank(
    demo: Demo, browser: Any, tmp_path: Path, width: int, height: int
) -> None:
    page = open_page(browser, demo.page.as_uri(), width=width, height=height).page
    out_dir = ARTIFACTS or tmp_path
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"status-page-{width}x{height}.png"
    png = page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    assert pixel_variance(browser, png) > 100  # a blank or single-colour page is ~0
    # nothing wider than the screen: tables scroll inside their own box
    assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_r_srv_8_usable_at_200_percent_zoom(demo: Demo, browser: Any) -> None:
    """200 % zoom of a 1280 px window is a 640 CSS px viewport."""
    page = open_page(browser, demo.page.as_uri(), width=640, height=400).page
    assert page.evaluate("document.documentElement.scrollWidth") <= 640
    assert page.locator("#budgets .bar-text").first.is_visible()


def test_r_srv_8_readable_with_scripts_off(demo: Demo, browser: Any) -> None:
    page = open_page(browser, demo.page.as_uri(), scripts=False).page
    text = page.inner_text("main")
    h = demo.doc["hourly"]
    assert f"{h['used']} / {h['limit']} calls" in text
    now = page.get_attribute("body", "data-now")
    assert f"at {now[:10]} {now[11:19]} UTC" in text  # server-rendered UTC times
    assert "Cooldowns" in text
    assert "Recent failovers" in text


def test_r_srv_8_times_in_the_viewers_zone_with_utc_on_hover(demo: Demo, browser: Any) -> None:
    page = open_page(browser, demo.page.as_uri(), timezone="Asia/Tokyo").page
    stamp = page.locator("header time")
    iso = stamp.get_attribute("datetime")
    assert stamp.get_attribute("title") == f"{iso[:10]} {iso[11:19]} UTC"
    hour = (int(iso[11:13]) + 9) % 24  # Tokyo is UTC+9, no daylight saving
    assert f"{hour:02d}:{iso[14:16]}:{iso[17:19]}" in stamp.inner_text()
    assert "UTC" not in stamp.inner_text()


def test_r_srv_8_health_section_in_the_browser(
    demo: Demo, browser: Any, tmp_path: Path
) -> None:
    """A document with a health block (R-DIAG-6) renders it: state as text, no console error,
    nothing wider than a 390 px screen."""
    health = [
        {"provider": "acme", "state": "cooling", "consecutive_failures": 3,
         "last_failure_kind": "auth", "last_failure_at": demo.doc["now"], "attempts_1h": 5,
         "failures_1h": 3, "probe_streak": 0},
        {"model": "bolt/quill-3", "state": "probing", "consecutive_failures": 1,
         "last_success_at": demo.doc["now"], "probe_streak": 2},
        {"model": "cirrus/max-2", "state": "healthy", "consecutive_failures": 0},
    ]  # fmt: skip
    path = tmp_path / "health.html"
    path.write_text(render_page({**demo.doc, "health": health}, inline=True))
    w = open_page(browser, path.as_uri(), width=390, height=844)
    states = w.page.locator("#health .tag.state").all_inner_texts()
    assert [s.split()[-1] for s in states] == ["cooling", "probing", "healthy"]
    assert w.page.evaluate("document.documentElement.scrollWidth") <= 390
    assert w.problems == []


def test_r_srv_8_pixel_variance_detects_a_blank_page(browser: Any) -> None:
    page = browser.new_page(viewport={"width": 390, "height": 300})
    page.set_content("<html><body style='background:#fff'></body></html>")
    assert pixel_variance(browser, page.screenshot()) < 1
    page.close()


MISSING_GLYPH = """(chars) => {
    // each character drawn in the page's own font (with the browser's fallback), compared with
    // a code point no font has: equal pixels mean a missing-glyph box (tofu)
    const font = getComputedStyle(document.body).fontFamily;
    const draw = (ch) => {
        const c = document.createElement('canvas'); c.width = 48; c.height = 48;
        const g = c.getContext('2d'); g.font = '32px ' + font; g.fillStyle = '#000';
        g.fillText(ch, 4, 38);
        return Array.from(g.getImageData(0, 0, 48, 48).data).join(',');
    };
    const box = draw('\\u{10FFFD}');
    return chars.filter((ch) => draw(ch) === box);
}"""


def _health_rows(now: str, n: int) -> list[dict[str, Any]]:
    states = ("healthy", "cooling", "probing")
    return [
        {"scope": "model", "target": f"provider-{i}/model-name-{i}", "state": states[i % 3],
         "consecutive_failures": i % 4, "last_failure_kind": "request_rejected",
         "last_failure_at": now, "last_success_at": now, "attempts_1h": 12, "failures_1h": 3,
         "probe_streak": i % 2}
        for i in range(n)
    ]  # fmt: skip


def _pools(now: str) -> list[dict[str, Any]]:
    """A pool in the status document's JSON shape (R-RT-7): a cooled candidate and a lease."""
    return [
        {"pool": "p", "strategy": "round-robin", "sticky": "on", "sticky_scope": "source",
         "cursor": 0,
         "candidates": [
             {"model": "a/m", "tier": 0, "effort": "low", "state": "eligible", "until": None},
             {"model": "b/m", "tier": 1, "effort": None, "state": "model_cooldown",
              "until": now}],
         "leases": [{"scope": "s1", "model": "a/m", "until": None},
                    {"scope": "pool", "model": "a/m", "until": now}]}
    ]  # fmt: skip


def test_r_srv_8_every_character_is_drawn_by_debians_default_fonts(
    demo: Demo, browser: Any, tmp_path: Path
) -> None:
    """Issue 33: the `cooling` badge used U+23F8, which Debian's fonts lack (a missing-glyph
    box). Every character of the page's text (every health state included) and of the
    stylesheet's generated content is drawn by an installed font."""
    path = tmp_path / "glyphs.html"
    now = demo.doc["now"]
    path.write_text(render_page({**demo.doc, "health": _health_rows(now, 3),
                                 "pools": _pools(now)}, inline=True))  # fmt: skip
    page = open_page(browser, path.as_uri()).page
    text = page.inner_text("body")
    assert "until it fails or cools" in text  # the pools section is drawn too
    css = render_page.__globals__["render_assets"]().css.decode()
    generated = "".join(re.findall(r'content:\s*"([^"]*)"', css))
    chars = sorted({ch for ch in text + generated if ord(ch) > 0x7E})
    assert "\u2192" in chars  # the check sees the page's non-ASCII characters (from -> to)
    assert page.evaluate(MISSING_GLYPH, chars) == []
    assert page.evaluate(MISSING_GLYPH, ["\u23f8"]) == ["\u23f8"]  # the check can fail


def test_r_srv_8_failure_kinds_differ_by_pattern_without_colour(
    demo: Demo, browser: Any, tmp_path: Path
) -> None:
    """Issue 33: every failure kind's legend swatch is distinct even with all colours made
    equal (pattern alone), so `auth` and `transport` no longer look the same."""
    from ledger.kinds import FailureKind

    hours = [dict(h) for h in demo.doc["hours_24"]]
    hours[-1] = {**hours[-1], "failed": {k.value: 1 for k in FailureKind}}
    path = tmp_path / "kinds.html"
    path.write_text(render_page({**demo.doc, "hours_24": hours}, inline=True))
    page = open_page(browser, path.as_uri()).page
    page.evaluate(  # one colour for every pattern (CSSOM writes are allowed by the CSP)
        """() => {
            const set = (sel, prop, value) => document.querySelectorAll(sel).forEach(
                (e) => e.style.setProperty(prop, value, 'important'));
            set('pattern .pbg', 'fill', '#777'); set('pattern .pdot', 'fill', '#fff');
            set('pattern .pfg', 'stroke', '#fff');
        }"""
    )
    swatches = page.locator(".legend li", has_text="failed:")
    assert swatches.count() == len(FailureKind)
    shots = {swatches.nth(i).locator("svg").screenshot() for i in range(swatches.count())}
    assert len(shots) == len(FailureKind)


def test_r_srv_8_chart_text_readable_and_health_compact_at_390px(
    demo: Demo, browser: Any, tmp_path: Path
) -> None:
    """Issue 33: at 390 px the chart's axis text was ~6 px and health took ten screens for ten
    targets: axis text is drawn at 11 px or more, and ten health rows fit one screen."""
    path = tmp_path / "narrow.html"
    path.write_text(render_page({**demo.doc, "health": _health_rows(demo.doc["now"], 10)},
                                inline=True))
    page = open_page(browser, path.as_uri(), width=390, height=844).page
    sizes = page.evaluate(
        """() => Array.from(document.querySelectorAll('.chart text')).map((t) => {
            const svg = t.ownerSVGElement;
            const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
            return parseFloat(getComputedStyle(t).fontSize) * scale; })"""
    )
    assert sizes
    assert min(sizes) >= 11, sizes
    health = page.locator("#health").bounding_box()
    assert health is not None
    assert health["height"] < 844
    box = page.locator("#health .scroll")
    assert box.evaluate("(e) => e.scrollWidth <= e.clientWidth")  # no sideways scrolling
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_r_srv_8_iso_like_24_hour_times_and_the_one_duration_format(
    demo: Demo, browser: Any
) -> None:
    """Issue 33: times read `12/01/2026, 05:48:29 PM UTC` and countdowns `51m 13s`: local times
    are ISO-like 24-hour with the offset, and the script's countdowns use the CLI's format."""
    from ledger.clock import human_duration_ms

    page = open_page(browser, demo.page.as_uri(), timezone="America/New_York",
                     clock_ms=1_900_000_000_000).page
    texts = page.locator("main time").all_text_contents()  # some are in a closed <details>
    assert texts
    for text in texts:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d [0-2]\d:[0-5]\d:[0-5]\d [+-]\d\d:\d\d", text), text
    assert page.locator("header time").inner_text().endswith(("-05:00", "-04:00"))
    page.clock.run_for(3_000)  # the page's ledger clock: the document's time plus 3 s
    for i, c in enumerate(demo.doc["cooldowns"]):
        shown = page.locator("#cooldowns .left").nth(i).inner_text()
        seconds = seconds_left(shown)
        assert shown == human_duration_ms(seconds * 1000)  # the CLI's format, exactly
        assert abs(seconds - (c["remaining_s"] - 3)) <= 15  # and the time left (a busy machine)
