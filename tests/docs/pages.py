"""The documentation as the tests read it: README.md and every page of the site (docs/**/*.md), so
an example checked in the README stays checked when it moves to a page of the site."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DEVELOPERS = DOCS / "design.md"  # the architecture map and the rule table: rule ids belong there
HEADING = re.compile(r"^(#{1,6}) (.*?)(?: \{#[^}]*\})?$")


def pages() -> list[Path]:
    """README.md first, then the site's pages in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def user_pages() -> list[Path]:
    """The pages a user reads (every one but the developers' map)."""
    return [p for p in pages() if p != DEVELOPERS]


def all_text() -> str:
    """Every page, one after another (each starts on a line of its own)."""
    return "\n".join(p.read_text() for p in pages())


def _headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index, level, title) of each heading outside fenced blocks."""
    found, fenced = [], False
    for number, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            found.append((number, len(match[1]), match[2].strip()))
    return found


def section(title: str) -> str:
    """The text under the one heading `title` (any level, in any page) up to the next heading of
    the same or a higher level; its subsections are included."""
    found = []
    for page in pages():
        lines = page.read_text().splitlines()
        headings = _headings(lines)
        for i, (start, level, text) in enumerate(headings):
            if text == title:
                end = next((n for n, lv, _ in headings[i + 1 :] if lv <= level), len(lines))
                found.append("\n".join(lines[start + 1 : end]) + "\n")
    assert len(found) == 1, f"{len(found)} headings {title!r} in README.md and docs/"
    return found[0]


def fenced(text: str, language: str) -> list[str]:
    """The bodies of the ```language blocks in `text`."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)
