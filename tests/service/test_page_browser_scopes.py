"""R-SRV-8 with R-SC-2: at 390 px the page's Scopes table scrolls in its own box and the page
itself never scrolls sideways, in Debian's chromium driven by playwright (the setup of
tests/service/test_page_browser.py, which skips when chromium is absent)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.browser import browser, ledger_cli, open_page
from tests.support.routing_fixtures import routing_catalog

__all__ = ["browser"]

LONG = "team-research-overnight-batch"


def test_r_srv_8_r_sc_2_the_scopes_table_scrolls_in_its_own_box_at_390px(
    browser: Any, tmp_path: Path
) -> None:
    """Before: the table stood bare in its section and the whole page scrolled sideways (681 px
    of document on a 390 px screen)."""
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(routing_catalog()))
    scopes = {LONG: {"callsPerHour": 1, "dailyEstimatedUsd": 5, "inFlight": 1},
              "ci": {"callsPerHour": 100}}  # fmt: skip
    (home / "recovery.json").write_text(json.dumps({"scopes": scopes}))
    # the long scope full on both counts: its row names when each slot frees
    ledger_cli(home, "reserve", "s1", "--model", "acct1/m", "--scope", LONG, "--scope", "ci")
    page_file = tmp_path / "status.html"
    ledger_cli(home, "status", "--html", str(page_file))
    w = open_page(browser, page_file.as_uri(), width=390, height=844)
    page = w.page
    assert page.locator("#scopes tr[data-scope]").count() == 2
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    box = page.locator("#scopes .scroll")
    assert box.evaluate("(e) => e.contains(document.querySelector('#scopes table'))")
    assert box.evaluate("(e) => e.clientWidth <= 390 && e.scrollWidth > e.clientWidth")
    # the box itself scrolls (the keyboard reaches it: it is focusable)
    assert box.evaluate("(e) => { e.scrollLeft = 100; return e.scrollLeft; }") > 0
    assert box.get_attribute("tabindex") == "0"
    assert page.evaluate("window.scrollX") == 0
    assert w.problems == []
