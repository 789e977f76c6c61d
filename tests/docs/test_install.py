"""What a fresh machine installs is what CI proved (constraints.txt), and no hint names the
unrelated `ledger` distribution on the public index (R-INST-1)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from click.testing import CliRunner
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ledger.cli.main import DISTRIBUTION, cli

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier  # one exact version a line
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = spec.version
    return pins


def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs.extend(extra)
    return [Requirement(r) for r in reqs]


def test_every_requirement_is_pinned_to_a_version_it_allows() -> None:
    """A requirement of pyproject (runtime, every extra) without a pin in constraints.txt would
    resolve to whatever is newest on a new machine; a pin outside its range would not install."""
    pins = _pins()
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (req.name, pins[name])


def test_the_running_environment_is_the_pinned_one() -> None:
    """The tests run on the versions CI proved: an install without `-c constraints.txt` (the
    README's test command) fails here, naming the package, instead of failing somewhere later."""
    pins = _pins()
    wrong = []
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in pins and dist.version != pins[name]:
            wrong.append(f"{name} {dist.version} (pinned {pins[name]})")
    assert not wrong, (
        "installed versions differ from constraints.txt; install with "
        "python -m pip install -c constraints.txt -e '.[dev]': " + ", ".join(sorted(wrong))
    )


FORBIDDEN = re.compile(r"pip install\s+['\"]?ledger(\[|['\"\s]|$)", re.MULTILINE)


def _texts() -> list[Path]:
    paths = [ROOT / "README.md", ROOT / ".ci" / "run", *ROOT.glob("docs/**/*.md")]
    for folder in ("ledger", "scripts", "bench", "examples"):
        paths.extend(p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".sh", ".md"})
    return paths


def test_r_inst_1_no_hint_installs_the_unrelated_ledger_distribution() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in _texts()
        if path.is_file() and FORBIDDEN.search(path.read_text(errors="replace"))
    ]
    assert not offenders


def test_r_inst_1_the_forbidden_pattern_is_the_one_users_were_told() -> None:
    """The scan above would have caught every hint of 40b478f."""
    for told in ("pip install 'ledger[serve]'", "pip install 'ledger[postgres]'",
                 "pip install ledger"):  # fmt: skip
        assert FORBIDDEN.search(told)
    assert not FORBIDDEN.search("python -m pip install -e '.[serve]'")
    assert not FORBIDDEN.search("pip install 'llm-budget-ledger[serve]'")


def test_r_inst_1_distribution_name_and_version() -> None:
    """`ledger --version` reads the distribution's own metadata (CI's wheel check runs it)."""
    assert PYPROJECT["project"]["name"] == DISTRIBUTION
    assert metadata.version(DISTRIBUTION) == PYPROJECT["project"]["version"]
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert PYPROJECT["project"]["version"] in result.output
