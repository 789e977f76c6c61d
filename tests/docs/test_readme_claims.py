"""Issue 25 items 4-6: README claims about the lock file, shipped base URLs and what `reserve`
grants, checked against what the program does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

from ledger.api import Ledger
from ledger.catalog import Catalog, known_providers
from tests.docs.pages import ROOT, all_text, section
from tests.support.ledgers import TEST_CATALOG

README = all_text()  # the README and the site's pages
DATA = ROOT / "ledger" / "data"


def _lock_row() -> str:
    return next(line for line in README.splitlines() if line.startswith("| `ledger.db-writelock`"))


def test_issue25_item4_lock_file_is_described_as_it_is(tmp_path: Path) -> None:
    led = Ledger.open(tmp_path, catalog=Catalog.model_validate(TEST_CATALOG), env={})
    try:
        led.reserve("s1", "alpha/small")
    finally:
        led.close()
    size = (tmp_path / "ledger.db-writelock").stat().st_size
    assert size == 16  # two 8-byte counters: turn and ticket
    row = _lock_row()
    assert "empty" not in row
    assert "16 bytes" in row
    assert "turn" in row
    assert "ticket" in row


def _shipped_base_urls() -> dict[str, str]:
    """Every base URL the package ships: the example catalog and the known public endpoints."""
    urls = {
        f"catalog.example.json {name}": p["baseUrl"]
        for name, p in json.loads((DATA / "catalog.example.json").read_text())["providers"].items()
        if "baseUrl" in p
    }
    for name, entries in known_providers().items():
        urls[f"provider_base_urls.json {name}"] = entries[1]
    return urls


def test_issue25_item5_readme_says_which_shipped_base_urls_are_plain_http() -> None:
    plain = {k: u for k, u in _shipped_base_urls().items() if urlsplit(u).scheme != "https"}
    assert "Every shipped base URL is `https://`" not in README
    for where, url in plain.items():
        assert urlsplit(url).hostname in {"127.0.0.1", "localhost"}, where  # only loopback
        assert f"`{url}`" in README, where  # and the README names it


def test_issue25_item6_reserve_grants_what_select_excludes_and_the_readme_says_why(
    tmp_path: Path,
) -> None:
    catalog = json.loads(json.dumps(TEST_CATALOG))
    catalog["providers"]["own"] = {"available": True, "api": "openai-chat"}  # no baseUrl known
    catalog["models"].append({"provider": "own", "id": "m1"})
    led = Ledger.open(tmp_path, catalog=Catalog.model_validate(catalog), env={})
    try:
        excluded = {e.model: str(e.reason) for e in led.select("s1").excluded}
        assert excluded["own/m1"] == "no_base_url"
        assert excluded["gamma/g1"] == "unavailable"
        assert led.reserve("s1", "own/m1").model == "own/m1"  # a caller's own client needs none
        assert led.reserve("s2", "gamma/g1").model == "gamma/g1"
    finally:
        led.close()
    text = section("Reservations and budgets")
    assert re.search(r"own\s+HTTP\s+client", text)
    assert "no_base_url" in text
    assert "unavailable" in text
