"""The import-layer contract (pyproject `[tool.importlinter]`, run by `lint-imports` in .ci/run)
names every unit of the package: a new top-level module or folder in no layer fails here, so the
contract cannot silently stop covering the code."""

from __future__ import annotations

import ast
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


def _imports_inside_functions() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        text = " ".join(lines[inner.lineno - 1 : inner.end_lineno])
                        found.append((str(path.relative_to(ROOT)), inner.lineno, text))
    return found


def test_every_import_inside_a_function_says_why_it_is_lazy() -> None:
    """Issue 43: an import inside a function stays only where it keeps `ledger --help` and
    `ledger status` start-up short, where FastAPI is the optional extra, or where a migration
    alone needs alembic; each says why on its line (`# lazy: …`). Any other goes to the top."""
    unexplained = [f"{path}:{line}" for path, line, text in _imports_inside_functions()
                   if "# lazy:" not in text]  # fmt: skip
    assert unexplained == []


def test_the_lazy_import_check_sees_imports_inside_functions() -> None:
    assert any(path == "ledger/store/migrate.py" for path, _, _ in _imports_inside_functions())
