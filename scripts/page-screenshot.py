#!/usr/bin/env python3
"""Regenerate docs/status-page.png: the status page of a fresh demo ledger, as Debian's chromium
renders it (headless, driven by playwright with executable_path; no browser download).

    python scripts/page-screenshot.py [--out docs/status-page.png] [--chromium /usr/bin/chromium]

Runs `ledger demo --home TMP`, then `ledger status --html`, then screenshots the file at 1000 px
wide (the top of the page), small enough for the README (< 200 KB).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
MAX_BYTES = 200_000


def ledger(home: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "ledger", "--home", str(home), *args], check=True,
                   stdout=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/status-page.png"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--height", type=int, default=1250)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "demo"
        ledger(home, "demo", "--home", str(home))
        page_file = Path(tmp) / "status.html"
        ledger(home, "status", "--html", str(page_file))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=opts.chromium, args=ARGS)
            page = browser.new_page(viewport={"width": opts.width, "height": opts.height})
            page.emulate_media(color_scheme="light")
            page.goto(page_file.as_uri())
            page.wait_for_load_state("load")
            # the home is a throw-away path: show a stable one in the picture
            page.evaluate(
                "(home) => document.querySelectorAll('code').forEach("
                "c => { c.textContent = c.textContent.replace(home, '/var/lib/ledger'); })",
                str(home),
            )
            png = page.screenshot(type="png")
            browser.close()
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_bytes(png)
    size = opts.out.stat().st_size
    print(f"wrote {opts.out} ({size} bytes)")
    if size > MAX_BYTES:
        print(f"warning: larger than {MAX_BYTES} bytes; lower --width/--height", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
