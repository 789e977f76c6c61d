"""Issue 47: the documentation site. The generated reference pages are what the code generates
now (a CLI option, a policy key or a reason code added without regenerating them fails here), the
site builds with `mkdocs build --strict` (every link and anchor resolves), the README stays short
and links into the site, and no user page cites design rule ids or issue numbers."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest

from ledger.config import parse_policy, policy_schema
from tests.docs.pages import DOCS, README, ROOT, user_pages

GENERATOR = ROOT / "scripts" / "gen_reference.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_issue47_generated_reference_pages_match_the_code() -> None:
    """What .ci/run checks: `python scripts/gen_reference.py --check` finds nothing to change."""
    done = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_issue47_a_new_cli_option_without_regenerating_fails_the_check() -> None:
    from ledger.cli.main import cli

    gen = _generator()
    status = cli.get_command(click.Context(cli), "status")
    assert status is not None
    added = click.Option(["--brand-new-option"], is_flag=True, help="Not documented yet.")
    status.params.append(added)
    try:
        pages, _ = gen.pages()
        assert "--brand-new-option" in pages["cli.md"]
        assert pages["cli.md"] != (DOCS / "reference" / "cli.md").read_text()
        assert gen.main(["--check"]) == 1
    finally:
        status.params.remove(added)
    assert gen.main(["--check"]) == 0


def test_issue47_a_key_or_code_without_a_meaning_fails_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = _generator()
    meanings = json.loads((ROOT / "scripts" / "reference_meanings.json").read_text())
    del meanings["recovery.json"]["leaseMs"]
    del meanings["refusal"]["probing"]
    monkeypatch.setattr(gen, "_meanings", lambda: meanings)
    _, missing = gen.pages()
    assert set(missing) == {"leaseMs", "reason code probing"}
    assert gen.main(["--check"]) == 1


def test_issue47_the_site_builds_strict(tmp_path: Path) -> None:
    """Every page in the nav, every link and anchor resolving (mkdocs.yml's validation)."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "s" / "reference" / "cli" / "index.html").is_file()


def test_issue47_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted(DOCS.rglob("*.md")):
        assert f" {page.relative_to(DOCS)}\n" in nav, page


def test_issue47_readme_is_short_and_links_into_the_site() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    links = re.findall(r"\]\(([^)#]+?)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith("http")]
    assert len({link for link in local if link.startswith("docs/")}) >= 20
    for link in local:
        assert (ROOT / link).exists(), link


RULE_ID = re.compile(r"\bR-[A-Z]+-\d+|\b[Ii]ssues? \d+|\bSPEC\b|\bsection \d+\b")


def test_issue47_user_pages_cite_no_rule_ids_or_issue_numbers() -> None:
    """Rule ids and issue numbers belong to docs/design.md, for developers."""
    for page in user_pages():
        found = RULE_ID.findall(page.read_text())
        assert not found, (page, found)


def test_issue47_readme_recovery_json_is_valid_and_sets_every_top_level_key() -> None:
    found = re.search(r"<!-- docs-check: complete-recovery-json -->\n```json\n(.*?)```",
                      README.read_text(), re.S)  # fmt: skip
    assert found is not None
    policy = parse_policy(found[1])
    assert set(json.loads(found[1])) == set(policy_schema()["properties"])
    assert policy.chains
    assert policy.pools
    assert policy.scopes
