"""R-SRV-8 (issue 22): the status page as HTML — pure rendering of the status document, and
`ledger status --html FILE` (standalone, atomic, exit codes as the rest of status). The browser
behaviour is in test_page_browser.py."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.page import render_assets, render_page
from ledger.page.render import health_rows, left
from tests.conftest import Clock, LedgerFactory, write_policy

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


def test_r_srv_8_left_format() -> None:
    assert [left(s) for s in (0, 0.2, 59, 61, 3600, 5400.5, -3)] == [
        "0s", "1s", "59s", "1m 01s", "1h 00m", "1h 30m", "0s"]


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
         "current": False},
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
