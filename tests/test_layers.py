"""The import-layer contract (pyproject `[tool.importlinter]`, run by `lint-imports` in .ci/run)
names every unit of the package: a new top-level module or folder in no layer fails here, so the
contract cannot silently stop covering the code."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ledger"


def _units() -> set[str]:
    modules = {f"ledger.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    folders = {f"ledger.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    return modules | folders


def _layered() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    names: set[str] = set()
    for layer in contract["layers"]:
        names.update(n.strip() for n in layer.replace("|", ":").split(":"))
    return names


def test_every_unit_is_in_a_layer() -> None:
    assert _units() - _layered() == set()


def test_every_layered_name_exists() -> None:
    assert _layered() - _units() == set()
