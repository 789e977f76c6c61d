"""R-SRV-8 (issue 22): the status page as HTML — pure rendering of the status document, and
`ledger status --html FILE` (standalone, atomic, exit codes as the rest of status). The browser
behaviour is in test_page_browser.py."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import shlex
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.clock import human_duration_ms
from ledger.kinds import FailureKind
from ledger.page import render_assets, render_page
from ledger.page.chart import PATTERNS, build_chart, pattern_of
from ledger.page.render import health_rows, left
from tests.support.ledgers import Clock, LedgerFactory, write_policy
from tests.support.routing_fixtures import RoutingFactory, routing_ledger

__all__ = ["routing_ledger"]

HOSTILE = "<script>alert('x')</script>&\"$(rm -rf ~)"


def cli(home: Path, *args: str) -> Any:
    from ledger.cli.main import cli as group

    return CliRunner().invoke(group, ["--home", str(home), *args], catch_exceptions=False)


class Tags(HTMLParser):
    """Every start tag with its attributes, and the raw text of script and style blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.blocks: dict[str, list[str]] = {"script": [], "style": []}
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._open = tag if tag in self.blocks else None
        if self._open:
            self.blocks[tag].append("")

    def handle_endtag(self, tag: str) -> None:
        self._open = None

    def handle_data(self, data: str) -> None:
        if self._open:
            self.blocks[self._open][-1] += data


def parse(html: str) -> Tags:
    tags = Tags()
    tags.convert_charrefs = False
    tags.feed(html)
    return tags


@pytest.fixture
def doc(home: Path, make_ledger: LedgerFactory, clock: Clock) -> dict[str, Any]:
    from ledger.classify import classify_kind
    from ledger.records import Failed

    write_policy(home, defaultModel="alpha/small", callsPerHour=30, dailyEstimatedUsd=1.0)
    led = make_ledger()
    bad = led.reserve(HOSTILE, "alpha/big", input_bytes=10)
    led.settle(bad.id, Failed(classify_kind("safety")))  # pauses the hostile source
    result = cli(home, "cooldown", "set", "alpha", "90m")
    assert result.exit_code == 0, result.output
    out = cli(home, "status", "--json")
    assert out.exit_code == 0, out.output
    document: dict[str, Any] = json.loads(out.output)
    return document


def test_r_srv_8_values_are_escaped_and_resume_is_shell_quoted(doc: dict[str, Any]) -> None:
    html = render_page(doc, home="/srv/my ledger")
    assert HOSTILE not in html
    assert "<script>alert" not in html
    command = f"ledger --home '/srv/my ledger' source resume {shlex.quote(HOSTILE)}"
    tags = parse(html)
    assert [t for t, _ in tags.tags].count("script") == 1
    # the command, unescaped by the browser, is the exact shell-quoted one
    from html import unescape

    assert unescape(command) == command
    assert command.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace(
        "'", "&#39;").replace('"', "&#34;") in html


@pytest.mark.parametrize("inline", [False, True])
def test_r_srv_8_no_inline_handler_style_attribute_or_external_asset(
    doc: dict[str, Any], inline: bool
) -> None:
    html = render_page(doc, refresh_url="/", inline=inline)
    for tag, attrs in parse(html).tags:
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        assert "style" not in attrs, tag
        for name in ("src", "href"):
            value = attrs.get(name) or ""
            assert not re.match(r"[a-z]+:", value) or value.startswith("data:"), value
    assert "http://" not in html
    assert "https://" not in html


def test_r_srv_8_standalone_csp_allows_exactly_the_inline_blocks(doc: dict[str, Any]) -> None:
    html = render_page(doc, inline=True, refresh_url="/ignored")
    tags = parse(html)
    meta = next(a for t, a in tags.tags if t == "meta" and a.get("http-equiv"))
    csp = str(meta["content"])
    assets = render_assets()
    assert tags.blocks["script"] == [assets.js.decode()]
    assert tags.blocks["style"] == [assets.css.decode()]
    for block, directive in ((assets.js, "script-src"), (assets.css, "style-src")):
        digest = base64.b64encode(hashlib.sha256(block).digest()).decode()
        assert f"{directive} 'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp
    assert "connect-src" not in csp  # default-src 'none': the file fetches nothing
    body = next(a for t, a in tags.tags if t == "body")
    assert "data-refresh" not in body  # no server behind a file
    served = render_page(doc, refresh_url="/")
    assert 'data-refresh="/"' in served
    assert '<link rel="stylesheet" href="/page.css">' in served
    assert '<script src="/page.js" defer></script>' in served
    assert "Content-Security-Policy" not in served  # the service sends it as a header


def test_r_srv_8_health_section_only_when_the_document_has_health(doc: dict[str, Any]) -> None:
    without = {k: v for k, v in doc.items() if k != "health"}
    assert 'id="health"' not in render_page(without)
    health = [
        {"scope": "provider", "target": "alpha", "state": "cooling", "consecutive_failures": 3,
         "last_failure_kind": "rate_limit", "last_failure_at": doc["now"],
         "last_success_at": None, "attempts_1h": 9, "failures_1h": 4, "probe_streak": 0},
        {"scope": "model", "target": "alpha/small", "state": "probing", "consecutive_failures": 1,
         "probe_streak": 2},
    ]  # fmt: skip
    html = render_page({**doc, "health": health})
    section = html[html.index('id="health"') : html.index('id="paused"')]
    assert "alpha/small" in section
    assert "cooling" in section
    assert "probing" in section
    assert "rate_limit" in section
    assert "4 / 9" in section
    assert 'id="health"' in render_page({**doc, "health": []})
    rows = health_rows(health)
    assert [(r["name"], r["scope"], r["state"]) for r in rows] == [
        ("alpha", "provider", "cooling"), ("alpha/small", "model", "probing")]


def test_r_srv_8_page_shows_budgets_cooldowns_and_paused(doc: dict[str, Any]) -> None:
    html = render_page(doc)
    assert f"{doc['hourly']['used']} / 30 calls" in html
    assert "$1.0000" in html  # the ceiling
    assert 'data-until="' + doc["cooldowns"][0]["until"] + '"' in html
    assert left(doc["cooldowns"][0]["remaining_s"]) in html
    assert "safety" in html


def test_r_srv_8_left_format_is_the_cli_duration_format() -> None:
    """Issue 33: one duration format for the CLI, the page and simulate (was `1m 01s` here)."""
    assert [left(s) for s in (0, 0.2, 59, 61, 3600, 5400.5, -3)] == [
        "0s", "1s", "59s", "1m1s", "1h", "1h30m", "0s"]
    for seconds in (1, 61, 3599, 3601, 86_400 + 7200):
        assert left(seconds) == human_duration_ms(seconds * 1000)


def test_r_srv_8_status_html_writes_whole_file_atomically(
    doc: dict[str, Any], home: Path, tmp_path: Path
) -> None:
    """The page replaces FILE whole (temporary file + rename), never a partial file."""
    target = tmp_path / "out" / "status.html"
    target.parent.mkdir()
    target.write_text("old page")
    result = cli(home, "status", "--html", str(target))
    assert result.exit_code == 0, result.output
    html = target.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert html.rstrip().endswith("</html>")
    assert sorted(p.name for p in target.parent.iterdir()) == ["status.html"]  # no temp left
    # the rename fails: one line, exit 2, the old file untouched and no temporary file left
    import os

    def refuse(src: str, dst: object) -> None:
        raise PermissionError(13, "Permission denied")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "replace", refuse)
        again = cli(home, "status", "--html", str(target))
    assert again.exit_code == 2
    assert again.output.strip() == f"ledger: cannot write {target}: Permission denied"
    assert target.read_text() == html
    assert sorted(p.name for p in target.parent.iterdir()) == ["status.html"]
    missing = cli(home, "status", "--html", str(tmp_path / "nodir" / "x.html"))
    assert missing.exit_code == 2
    assert len(missing.output.strip().splitlines()) == 1
    assert not (tmp_path / "nodir").exists()
    both = cli(home, "status", "--json", "--html", str(target))
    assert both.exit_code == 2


def test_r_srv_8_status_html_without_a_ledger_is_the_empty_ledgers_page(tmp_path: Path) -> None:
    home = tmp_path / "h"
    target = tmp_path / "page.html"
    result = cli(home, "status", "--html", str(target))
    assert result.exit_code == 0, result.output
    assert "no ledger database" in target.read_text()  # the warning is on the page
    assert not home.exists()  # a read creates no state directory (issue 25 item 2)


def test_r_srv_8_stale_policy_writer_stands_out(doc: dict[str, Any]) -> None:
    writers = [
        *doc["policy"]["writers"],
        {"fingerprint": "0ld0ld0ld0ld", "last_seen": doc["now"], "reservations": 2,
         "current": False, "live": True},
    ]  # fmt: skip
    html = render_page({**doc, "policy": {**doc["policy"], "writers": writers}})
    section = html[html.index('id="writers"') :]
    assert "Stale policy:" in section
    stale = section[section.index("0ld0ld0ld0ld") :]
    assert stale.index("STALE") < stale.index("</li>")  # a text label, not colour alone
    assert 'class="stale"' in section
    assert "Stale policy:" not in render_page(doc)


def test_r_srv_8_a_spent_source_names_the_cap_to_raise_before_resume(doc: dict[str, Any]) -> None:
    spent = {**doc["sources"]["list"][0], "id": "spent-one", "pause_reason": "source_calls"}
    both = {**doc, "sources": {**doc["sources"], "list": [*doc["sources"]["list"], spent]}}
    html = render_page(both)
    card = html[html.index("spent-one"):]
    assert "it used its <code>sourceCalls</code>" in card[: card.index("</li>")]
    assert html.count("raise it in recovery.json") == 1  # not for the source paused by safety


def test_r_srv_8_page_says_work_can_run_with_the_routes(doc: dict[str, Any]) -> None:
    """Issue 33: the page answers "can work run now?" from the document: yes with the routes a
    fresh source would get, in order, and each excluded model with its reason."""
    assert doc["routes"]  # alpha is cooling; others are eligible
    html = render_page(doc)
    section = html[html.index('id="now"') : html.index('id="budgets"')]
    assert "<strong>Yes.</strong>" in section
    shown = re.findall(r"<code>([^<]+)</code>", section[: section.index("</p>")])
    assert shown == doc["routes"]
    for e in doc["excluded"]:
        row = section[section.index(f"<code>{e['model']}</code>") :]
        assert e["reason"] in row[: row.index("</tr>")]


def test_r_srv_8_page_says_no_route_and_when_the_first_frees(
    home: Path, make_ledger: LedgerFactory
) -> None:
    write_policy(home, defaultModel="alpha/small")
    make_ledger()
    for provider, span in (("alpha", "2h"), ("beta", "30m"), ("gamma", "45m")):
        assert cli(home, "cooldown", "set", provider, span).exit_code == 0
    doc = json.loads(cli(home, "status", "--json").output)
    assert doc["routes"] == []
    assert doc["routes_retry_at"]
    html = render_page(doc)
    section = html[html.index('id="now"') : html.index('id="budgets"')]
    assert "<strong>Yes.</strong>" not in section
    answer = section[section.index('class="answer"') : section.index("</p>")]
    assert "no eligible route; the first frees at" in answer
    assert f'datetime="{doc["routes_retry_at"]}"' in answer
    assert ">30m<" in answer  # the countdown to the first route, in the one duration format
    rows = section[section.index("<tbody>") :]
    assert re.findall(r"<tr><td><code>([^<]+)</code>", rows) == [
        e["model"] for e in doc["excluded"]
    ]
    for e in doc["excluded"]:
        row = rows[rows.index(f"<code>{e['model']}</code>") :]
        assert f"<td>{e['reason']}" in row[: row.index("</tr>")]


def test_r_srv_8_queue_due_next_due_and_why_the_oldest_wait(
    home: Path, make_ledger: LedgerFactory, clock: Clock
) -> None:
    """Issue 33: the queue block (status --json `queue`) and its section on the page: due now,
    next due, the oldest queued sources in claim order and why each waits."""
    write_policy(home, defaultModel="alpha/small")
    led = make_ledger()
    for sid in ("q-old", "q-held", "q-later", "q-new"):
        led.add_source(sid)
        clock.advance(1000)
    claim = led.claim("w1")
    assert claim is not None
    assert claim.source_id == "q-old"
    assert led.finish("q-old", "w1")
    held = led.claim("w1")
    assert held is not None
    assert held.source_id == "q-held"
    later = led.claim("w2")
    assert later is not None
    assert later.source_id == "q-later"
    failure = led.commit_failed("q-later", "w2", "alpha/small")
    assert failure is not None
    led.release("q-later", "w2")  # queued again, behind its retry time
    doc = json.loads(cli(home, "status", "--json").output)
    queue = doc["queue"]
    assert queue["due_now"] == 1  # q-new; q-held is leased, q-later waits for its retry time
    assert queue["next_due_at"] is not None
    assert queue["next_due_at"] > doc["now"]
    waits = {row["id"]: row["waits"] for row in queue["oldest"]}
    assert waits == {"q-held": "leased", "q-new": "waiting_for_worker", "q-later": "retry_later"}
    assert [row["id"] for row in queue["oldest"]][-1] == "q-later"  # checked last: claim order
    html = render_page(doc)
    section = html[html.index('id="queue"') : html.index('id="hours"')]
    assert "<strong>1</strong> due now" in section
    assert f'datetime="{queue["next_due_at"]}"' in section
    for text in ("a worker holds it", "due; no worker has claimed it yet",
                 "waits for its retry time"):  # fmt: skip
        assert text in section


def test_r_srv_8_page_shows_notices_last_attempts_and_the_store(doc: dict[str, Any]) -> None:
    html = render_page(doc)
    notices = html[html.index('id="notices"') : html.index('id="attempts"')]
    assert doc["notices"]
    assert all(n["message"] in notices for n in doc["notices"])
    attempts = html[html.index('id="attempts"') : html.index('id="store"')]
    assert attempts.count("<tr><td>") == min(10, len(doc["recent"])) > 0
    store = html[html.index('id="store"') : html.index('id="writers"')]
    st = doc["store"]
    assert f"backend <strong>{st['backend']}</strong>" in store
    assert f"revision <strong>{st['revision']}</strong>" in store
    assert f"journal mode <strong>{st['journal_mode']}</strong>" in store


def test_r_srv_8_every_failure_kind_has_a_pattern_of_its_own() -> None:
    """Issue 33: `auth` and `transport` looked the same (6 patterns cycled for 7+ kinds): every
    kind of the policy table has its own pattern geometry, not only its own colour."""
    kinds = [k.value for k in FailureKind]
    geometry = {(PATTERNS[pattern_of(k)].transform, PATTERNS[pattern_of(k)].shapes) for k in kinds}
    assert len(geometry) == len(kinds)
    hours = [
        {"start": "2026-01-01T00:00:00.000Z", "end": "2026-01-01T01:00:00.000Z", "attempts": 11,
         "succeeded": 0, "failed": dict.fromkeys(kinds, 1), "other": 0, "spent_usd": 0.0}
    ]  # fmt: skip
    chart = build_chart(hours)
    assert len({css for _kind, css in chart.kinds}) == len(kinds)
    assert pattern_of("not-a-kind") == pattern_of("unknown")


def test_r_srv_8_cost_is_a_step_per_hour_on_a_titled_axis(doc: dict[str, Any]) -> None:
    """Issue 33: the cost line ramped from $0 an hour ago to now; it is cost per hour, flat
    across each hour, on a right axis titled so."""
    hours = doc["hours_24"]
    assert hours[-1]["spent_usd"] > 0
    chart = build_chart(hours)
    points = [tuple(map(float, p.split(","))) for p in chart.cost_points.split()]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        assert x0 == x1 or y0 == y1  # horizontal within an hour, vertical between hours
    html = render_page(doc)
    assert ">cost per hour</text>" in html
    assert ">calls per hour</text>" in html
    assert "estimated cost per hour (right axis)" in html


PAGE_POOLS = {
    "p": {"candidates": [{"model": "acct1/m", "tier": 0}, {"model": "acct2/m", "effort": "low"},
                         {"model": "acct3/m", "tier": 1}],
          "strategy": "round-robin", "sticky": "on"},
}  # fmt: skip


def section(page: str, ident: str) -> str:
    """The HTML of one `<section id=...>` of the page."""
    start = page.index(f'<section id="{ident}"')
    return page[start : page.index("</section>", start)]


def test_r_rt_7_page_shows_pools_with_cursor_candidates_and_sticky_leases(
    routing_ledger: RoutingFactory,
) -> None:
    from ledger.kinds import CooldownScope
    from ledger.records import Success
    from ledger.status.document import build_status

    led = routing_ledger(pools=PAGE_POOLS, scopes={"nightly": {"callsPerHour": 5}})
    first = led.reserve("src-1", "pool/p", input_bytes=10, scopes=["nightly"])
    led.settle(first.id, Success(input_tokens=1, output_tokens=1))
    led.store.set_cooldown(CooldownScope.MODEL, "acct3/m", 3_600_000, None)
    doc = build_status(led)
    page = render_page(doc)
    pools = section(page, "pools")
    assert '<h2 id="pools-h">Pools</h2>' in pools
    assert "<code>pool/p</code>" in pools
    assert "strategy <strong>round-robin</strong>" in pools
    assert "sticky <strong>on</strong> (per source)" in pools
    cursor = doc["pools"][0]["cursor"]
    assert cursor is not None
    on = doc["pools"][0]["candidates"][cursor]["model"]
    assert f"cursor <strong>{cursor}</strong> (on <code>{on}</code>)" in pools
    rows = re.findall(r'<tr data-candidate="([^"]+)">(.*?)</tr>', pools)
    assert [model for model, _ in rows] == ["acct1/m", "acct2/m", "acct3/m"]
    cells = {m: re.findall(r"<td[^>]*>(.*?)</td>", row) for m, row in rows}
    assert '<span class="tag eligible">eligible</span>' in cells["acct1/m"][4]
    assert cells["acct2/m"][3] == "low"  # effort
    assert cells["acct3/m"][2] == "1"  # tier
    assert "model_cooldown" in cells["acct3/m"][4]
    assert "<time" in cells["acct3/m"][5]  # the cooldown's end
    assert "Live sticky leases" in pools
    assert f"source <code>src-1</code></td><td><code>{first.model}</code>" in pools
    assert "until it fails or cools" in pools
    scopes = section(page, "scopes")  # R-SC-2: the scope's calls against its limit
    assert '<tr data-scope="nightly">' in scopes
    assert "<td>1 / 5</td>" in scopes
    assert {ch for ch in pools if ord(ch) > 0x7E} <= {"\u00b7"}  # ASCII and the page's dot


def test_r_rt_7_no_pools_no_pools_section(routing_ledger: RoutingFactory) -> None:
    from ledger.status.document import build_status

    led = routing_ledger()
    led.reserve("src-1", "acct1/m", input_bytes=10)
    doc = build_status(led)
    assert "pools" not in doc
    page = render_page(doc)
    assert 'id="pools"' not in page
    assert "Pools" not in page
