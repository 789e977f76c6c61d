"""R-SRV-8 with R-TOK-5: the page's Token budgets section in Debian's chromium driven by playwright
(the setup of tests/service/test_page_browser.py, which skips when chromium is absent): at 390 px
each window is one card and the page never scrolls sideways, a full window's bar says so, and the
time until a window frees counts down in the page's clock; the same for the provider limits
learned from rate-limit headers (R-TOK-4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ledger.api import Ledger
from ledger.clock import now_ms
from ledger.learned import read_limits
from ledger.records import Success
from tests.service.test_page_browser import seconds_left
from tests.support.browser import browser, ledger_cli, open_page
from tests.support.routing_fixtures import routing_catalog

__all__ = ["browser"]


def test_r_srv_8_r_tok_5_token_windows_at_390px_full_and_counting_down(
    browser: Any, tmp_path: Path
) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(routing_catalog()))
    policy = {
        "replyTokens": 100,
        "tokenBudgets": {"acct1": {"tokensPerMinute": 1100},
                         "acct1/*": {"tokensPerDay": 1_000_000}},
        "scopes": {"team-research-overnight-batch": {"inputTokensPerMinute": 50_000}},
    }  # fmt: skip
    (home / "recovery.json").write_text(json.dumps(policy))
    # 1,000 input + 100 reply tokens: acct1's minute is full
    ledger_cli(home, "reserve", "s1", "--model", "acct1/m", "--input-bytes", "3000",
               "--scope", "team-research-overnight-batch")
    page_file = tmp_path / "status.html"
    ledger_cli(home, "status", "--html", str(page_file))
    w = open_page(browser, page_file.as_uri(), width=390, height=844, clock_ms=1_900_000_000_000)
    page = w.page
    rows = page.locator("#tokens tr[data-token-window]")
    assert rows.count() == 3
    full = page.locator('#tokens tr[data-token-window="provider:acct1:tokensPerMinute"]')
    assert full.get_attribute("class") == "full"
    assert full.locator(".bar-text").inner_text().startswith("1,100 / 1,100 tokens")
    assert "full" in full.locator(".bar-text").evaluate(
        "(e) => getComputedStyle(e, '::after').content")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.evaluate("window.scrollX") == 0
    # stacked: each window is a card as wide as the screen, its labels beside its values
    box = full.bounding_box()
    assert box is not None
    assert box["width"] <= 390
    span = full.locator(".left")
    before = seconds_left(span.inner_text())
    page.clock.run_for(20_000)
    after = seconds_left(span.inner_text())
    assert 0 < before <= 60
    assert before - after >= 19
    assert w.problems == []


def test_r_srv_8_r_tok_5_learned_limits_at_390px_left_for_the_next_and_counting_down(
    browser: Any, tmp_path: Path
) -> None:
    """A provider reported 1,200 tokens left for 20 s on acct1/m; a reservation of 1,100 tokens
    (1,000 input + 100 reply) granted since leaves 100 for the next one: the card names the
    provider and model, what was reported and what is left, and its reset counts down."""
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(routing_catalog()))
    (home / "recovery.json").write_text(json.dumps({"replyTokens": 100}))
    led = Ledger.open(home, env={})
    heard = led.reserve("heard", "acct1/m")
    headers = {"x-ratelimit-remaining-tokens": "1200", "x-ratelimit-limit-tokens": "90000",
               "x-ratelimit-reset-tokens": "20s"}  # fmt: skip
    led.settle(heard.id, Success(10, 5, limits=read_limits(headers, now_ms() - 1)))
    led.reserve("after", "acct1/m", input_bytes=3000)  # counted against the reading
    led.close()
    page_file = tmp_path / "status.html"
    ledger_cli(home, "status", "--html", str(page_file))
    w = open_page(browser, page_file.as_uri(), width=390, height=844, clock_ms=1_900_000_000_000)
    page = w.page
    rows = page.locator("#learned tr[data-learned]")
    assert rows.count() == 1
    card = page.locator('#learned tr[data-learned="acct1/m:tokens"]')
    assert card.locator('td[data-label="provider"]').inner_text() == "acct1"
    assert card.locator('td[data-label="model"]').inner_text().startswith("m")
    assert card.locator(".reported").inner_text().startswith("1,200 of 90,000")
    assert card.locator(".bar-text").inner_text() == "100 tokens left"
    assert card.get_attribute("class") is None  # room left: not full
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.evaluate("window.scrollX") == 0
    box = card.bounding_box()
    assert box is not None
    assert box["width"] <= 390
    span = card.locator(".left")
    before = seconds_left(span.inner_text())
    page.clock.run_for(10_000)
    after = seconds_left(span.inner_text())
    assert 0 < before <= 20
    assert before - after >= 9
    assert w.problems == []
