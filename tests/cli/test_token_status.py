"""R-TOK-5 (status part): `ledger status` text, `--json` and `--prometheus` show each configured
token window's use against its limit and when it frees, read at a frozen ledger time.

With `replyTokens` 100 and 300 input bytes a reservation's estimate is 100 input + 100 reply
tokens (R-TOK-2); a settled one counts its usage (R-TOK-3)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledger.clock import DAY_MS, iso, virtual_time
from ledger.learned import read_limits
from ledger.page.render import render_page
from ledger.records import Success
from ledger.status.document import build_status
from tests.support.backends import BACKENDS
from tests.support.ledgers import T0, Clock, LedgerFactory, write_policy
from tests.support.status_cli import cli_ok, status_json

MINUTE = 60_000
POLICY: dict[str, Any] = {
    "callsPerHour": 100,
    "replyTokens": 100,
    "tokenBudgets": {"alpha": {"tokensPerMinute": 1000}, "alpha/*": {"tokensPerDay": 5000}},
    "scopes": {"night": {"inputTokensPerMinute": 500}},
}


def _windows(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(w["target"] or f"scope:{w['scope']}", w["window"]): w for w in doc["token_budgets"]}


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_5_status_shows_each_token_window_against_its_limit(
    home: Path, make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    write_policy(home, **POLICY)
    led = make_ledger()
    a = led.reserve("s1", "alpha/small", input_bytes=300, scopes=["night"])
    clock.advance(1000)
    led.reserve("s2", "alpha/small", input_bytes=300)  # open: counts its estimate, 200
    led.settle(a.id, Success(input_tokens=10, output_tokens=20))  # counts its usage, 30
    clock.advance(1000)
    with virtual_time(clock):
        doc = status_json(home)
        text = cli_ok(home, "status")
        prom = cli_ok(home, "status", "--prometheus")
    windows = _windows(doc)
    assert list(windows) == [
        ("alpha", "tokensPerMinute"), ("alpha/*", "tokensPerDay"), ("scope:night",
                                                                   "inputTokensPerMinute"),
    ]  # fmt: skip
    assert windows[("alpha", "tokensPerMinute")] == {
        "target": "alpha", "scope": None, "kind": "provider", "window": "tokensPerMinute",
        "limit": 1000, "used": 230, "frees_at": iso(T0 + MINUTE),
    }  # fmt: skip
    assert windows[("alpha/*", "tokensPerDay")]["kind"] == "glob"
    assert windows[("alpha/*", "tokensPerDay")]["used"] == 230
    assert windows[("alpha/*", "tokensPerDay")]["frees_at"] == iso(T0 + DAY_MS)
    night = windows[("scope:night", "inputTokensPerMinute")]
    assert (night["target"], night["kind"], night["used"], night["limit"]) == (
        None, "scope", 10, 500
    )
    assert night["frees_at"] == iso(T0 + MINUTE)

    frees = iso(T0 + MINUTE)
    assert f"tokens provider alpha: tokensPerMinute 230 / 1,000 (frees from {frees})" in text
    assert "tokens glob alpha/*: tokensPerDay 230 / 5,000" in text
    assert "tokens scope night: inputTokensPerMinute 10 / 500" in text

    samples = {
        (f.name, s.labels["target"], s.labels["window"]): s.value
        for f in text_string_to_metric_families(prom)
        for s in f.samples
        if f.name.startswith("ledger_token_budget_")
    }
    assert samples[("ledger_token_budget_used", "alpha", "tokensPerMinute")] == 230
    assert samples[("ledger_token_budget_limit", "alpha", "tokensPerMinute")] == 1000
    assert samples[("ledger_token_budget_used", "scope:night", "inputTokensPerMinute")] == 10

    clock.ms = T0 + MINUTE + 500  # a's grant left the minute; b's (at T0 + 1 s) has not
    later = _windows(build_status(led))  # the library's clock (PostgreSQL's CLI reads the server's)
    assert later[("alpha", "tokensPerMinute")]["used"] == 200
    assert later[("alpha", "tokensPerMinute")]["frees_at"] == iso(T0 + 1000 + MINUTE)
    assert later[("scope:night", "inputTokensPerMinute")]["used"] == 0
    assert later[("scope:night", "inputTokensPerMinute")]["frees_at"] is None
    assert later[("alpha/*", "tokensPerDay")]["used"] == 230


def test_r_tok_5_a_window_that_holds_nothing_and_an_overrun_that_outlives_its_grant(
    home: Path, make_ledger: LedgerFactory, clock: Clock
) -> None:
    write_policy(home, callsPerHour=100, replyTokens=100,
                 tokenBudgets={"alpha/small": {"outputTokensPerMinute": 400}})
    led = make_ledger()
    with virtual_time(clock):
        (empty,) = status_json(home)["token_budgets"]
    assert (empty["kind"], empty["used"], empty["frees_at"]) == ("model", 0, None)
    r = led.reserve("s1", "alpha/small", input_bytes=300)
    clock.advance(50_000)
    led.settle(r.id, Success(input_tokens=10, output_tokens=350))  # 250 over its estimate
    clock.ms = T0 + MINUTE + 1000  # the grant left the window; its overrun counts until +50 s
    (window,) = build_status(led)["token_budgets"]
    assert window["used"] == 250
    assert window["frees_at"] == iso(T0 + 50_000 + MINUTE)


def _section(page: str, name: str) -> str:
    start = page.index(f'<section id="{name}"')
    return page[start : page.index("</section>", start)]


def test_r_tok_5_the_page_shows_each_token_window_use_limit_and_when_it_frees(
    home: Path, make_ledger: LedgerFactory, clock: Clock
) -> None:
    write_policy(home, **{**POLICY, "tokenBudgets": {**POLICY["tokenBudgets"],
                                                     "beta/big": {"tokensPerMinute": 400}}})
    led = make_ledger()
    led.reserve("s1", "alpha/small", input_bytes=300, scopes=["night"])  # 100 in + 100 reply
    clock.advance(2000)
    doc = build_status(led)
    section = _section(render_page(doc), "tokens")
    rows = dict(re.findall(r'<tr data-token-window="([^"]+)"(?: class="(full)")?', section))
    assert list(rows) == [
        "provider:alpha:tokensPerMinute", "glob:alpha/*:tokensPerDay",
        "model:beta/big:tokensPerMinute", "scope:night:inputTokensPerMinute",
    ]  # fmt: skip
    assert set(rows.values()) == {""}  # none full
    assert "provider <code>alpha</code>" in section
    assert "scope <code>night</code>" in section
    assert "200 / 1,000 tokens" in section
    assert "200 / 5,000 tokens" in section
    assert "100 / 500 tokens" in section
    assert "0 / 400 tokens" in section
    frees = iso(T0 + MINUTE)
    assert f'<time datetime="{frees}"' in section
    assert f'<span class="left" data-until="{frees}">58s</span>' in section  # counts down
    assert f'<span class="left" data-until="{iso(T0 + DAY_MS)}">' in section
    assert section.count("nothing counted") == 1  # beta/big holds nothing

    led.reserve("s2", "alpha/small", input_bytes=2100)  # 700 in + 100 reply: alpha's minute full
    full = _section(render_page(build_status(led)), "tokens")
    rows = dict(re.findall(r'<tr data-token-window="([^"]+)"(?: class="(full)")?', full))
    assert rows["provider:alpha:tokensPerMinute"] == "full"
    assert rows["scope:night:inputTokensPerMinute"] == ""
    assert 'aria-label="tokens per minute of provider alpha: 1,000 / 1,000 tokens"' in full


def test_r_tok_5_no_token_budget_no_page_section(home: Path, make_ledger: LedgerFactory) -> None:
    write_policy(home, callsPerHour=100)
    led = make_ledger()
    led.reserve("s1", "alpha/small", input_bytes=300)
    doc = build_status(led)
    assert doc["token_budgets"] == []
    assert 'id="tokens"' not in render_page(doc)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_tok_4_status_shows_each_learned_limit_and_what_is_left(
    home: Path, make_ledger: LedgerFactory, clock: Clock, ledger_db: str | None
) -> None:
    write_policy(home, callsPerHour=100, replyTokens=100)
    led = make_ledger()
    heard = led.reserve("s0", "alpha/small", input_bytes=300)
    headers = {"x-ratelimit-remaining-tokens": "1200", "x-ratelimit-reset-tokens": "20s",
               "x-ratelimit-limit-tokens": "30000"}  # fmt: skip
    led.settle(heard.id, Success(10, 5, limits=read_limits(headers, clock())))
    clock.advance(1000)
    led.reserve("s1", "alpha/small", input_bytes=300)  # 200 granted since the reading
    with virtual_time(clock):
        doc = status_json(home)
        text = cli_ok(home, "status")
        prom = cli_ok(home, "status", "--prometheus")
    assert doc["learned_limits"] == [{
        "model": "alpha/small", "kind": "tokens", "remaining": 1200, "left": 1000,
        "limit": 30000, "read_at": iso(T0), "resets_at": iso(T0 + 20_000),
    }]  # fmt: skip
    assert (f"learned alpha/small tokens: 1,000 left (reported 1,200 of 30,000 at {iso(T0)}); "
            f"resets {iso(T0 + 20_000)}") in " ".join(text.split())  # fmt: skip
    (left,) = [s for f in text_string_to_metric_families(prom) for s in f.samples
               if f.name == "ledger_learned_tokens_left"]  # fmt: skip
    assert (left.labels, left.value) == ({"model": "alpha/small", "kind": "tokens"}, 1000)
    clock.advance(20_000)  # past its reset: no longer shown
    assert build_status(led)["learned_limits"] == []
