"""Debian chromium driven headless by playwright for the status page tests (R-SRV-8); the tests
skip when chromium is absent (a module importing this one is skipped), and under CI (CI=true) a
missing chromium fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("LEDGER_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but chromium is missing (.ci/run installs it with apt-get)",
                    pytrace=False)
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
if os.environ.get("CI") == "true":  # CI installs the dev extra: a missing playwright fails
    import playwright.sync_api as playwright_api
else:
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")


def ledger_cli(home: Path, *args: str) -> str:
    """The real `ledger` command in its own process."""
    result = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as pw:
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        b = pw.chromium.launch(executable_path=exe, args=ARGS)
        yield b
        b.close()


@dataclass
class Watched:
    page: Any
    problems: list[str]
    requests: list[str]


def open_page(browser: Any, url: str, width: int = 1280, height: int = 800,
              scripts: bool = True, clock_ms: int | None = None,
              timezone: str = "UTC") -> Watched:
    context = browser.new_context(
        viewport={"width": width, "height": height}, java_script_enabled=scripts,
        timezone_id=timezone, locale="en-GB",
        extra_http_headers={"Authorization": f"Bearer {TOKEN}"},
    )
    page = context.new_page()
    problems: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in (
        "error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
    page.on("request", lambda r: requests.append(r.url))
    if clock_ms is not None:
        page.clock.install(time=clock_ms / 1000)
    page.goto(url)
    page.wait_for_load_state("load")
    return Watched(page, problems, requests)


TOKEN = "page-test-token-0123456789abcdef"
