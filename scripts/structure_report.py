"""Print the structure figures of the `ledger` package from its own imports.

    python scripts/structure_report.py [--json] [--no-trace]

Figures: modules at the top level of `ledger/` (not counting `__init__` and `__main__`), import
loops between units (a unit is a top-level module or a first-level folder; imports inside
functions count, `if TYPE_CHECKING:` blocks and the root package's re-exports do not), the
biggest source files, test files at the top of `tests/` and in each of its folders, test files
that import another test module, imports made inside functions, and
(unless --no-trace) the `ledger` files one gateway request passes through: one OpenAI-format
request through the service's own app to a local stand-in, traced with sys.setprofile, counting
the distinct files and how often the path returns to a file it had already left.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import sys
import tempfile
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ledger"
BIG_LINES = 700


def module_name(path: Path) -> str:
    """`ledger/gateway/sse.py` -> `ledger.gateway.sse` (a package is its `__init__`)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str | None:
    """The unit a module belongs to: `ledger.x` for a top-level module or folder `x`."""
    parts = module.split(".")
    if parts[0] != "ledger" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path) -> Iterator[tuple[str, bool]]:
    """(imported module, made inside a function) for each import of the file, TYPE_CHECKING
    blocks left out; `from a import b` yields `a.b` when that is a module, else `a`."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    yield from walk(other, in_function)
                continue
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, in_function
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    yield (full if _is_module(full) else base), in_function
            yield from walk(child, inner)

    yield from walk(tree, False)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def unit_graph() -> tuple[dict[str, set[str]], int]:
    """Unit -> units it imports, and the number of imports made inside functions."""
    graph: dict[str, set[str]] = defaultdict(set)
    lazy = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "__init__.py":
            continue  # the root package's re-exports do not count
        source = unit_of(module_name(path))
        if source is None:
            continue
        graph.setdefault(source, set())
        for target, in_function in imports(path):
            unit = unit_of(target)
            if unit is None or unit == source:
                continue
            graph[source].add(unit)
            lazy += in_function
    return graph, lazy


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def tests_importing_tests(tests: Path) -> list[str]:
    """Test files that import another test module (issue 43: shared helpers live in
    tests/support/, fixtures in tests/conftest.py)."""
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            if any(name.rsplit(".", 1)[-1].startswith("test_") for name in names):
                found.append(str(path.relative_to(tests.parent)))
                break
    return found


def figures() -> dict[str, Any]:
    """Every static figure."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in {"__init__", "__main__"})
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    graph, lazy = unit_graph()
    sizes = sorted(
        [(len(p.read_text().splitlines()), str(p.relative_to(ROOT)))
         for p in PACKAGE.rglob("*.py")],
        reverse=True,
    )
    tests = ROOT / "tests"
    tests_top = sorted(p.name for p in tests.glob("test_*.py"))
    test_folders = {
        p.name: len(list(p.glob("test_*.py")))
        for p in sorted(tests.iterdir())
        if p.is_dir() and any(p.glob("test_*.py"))
    }
    return {
        "top_level_modules": len(top),
        "first_level_folders": len(folders),
        "units": len(graph),
        "unit_import_arrows": sum(len(v) for v in graph.values()),
        "imports_inside_functions": lazy,
        "unit_loops": loops(graph),
        "files_over_700_lines": [f"{path} ({n})" for n, path in sizes if n > BIG_LINES],
        "biggest_files": [f"{path} ({n})" for n, path in sizes[:5]],
        "source_files": len(sizes),
        "test_files_at_top": len(tests_top),
        "test_files_in_folders": test_folders,
        "tests_importing_a_test_module": tests_importing_tests(tests),
    }


def gateway_path() -> dict[str, Any]:
    """The `ledger` files one gateway request enters, in order, traced in this process."""
    from ledger.api import Ledger
    from ledger.demo import DEMO_KEY, DEMO_KEY_ENV, DEMO_POLICY, demo_catalog
    from ledger.service.local import one_request
    from ledger.standin.server import StandIn

    sequence: list[str] = []
    prefix = str(PACKAGE) + "/"

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(prefix) and (not sequence or sequence[-1] != name):
                sequence.append(name)

    with tempfile.TemporaryDirectory() as tmp, StandIn({}) as standin:
        home = Path(tmp)
        (home / "catalog.json").write_text(json.dumps(demo_catalog(standin)))
        (home / "recovery.json").write_text(json.dumps(DEMO_POLICY))
        ledger = Ledger.open(home, str(home / "ledger.db"), env={DEMO_KEY_ENV: DEMO_KEY})
        try:
            one_request(ledger, "acme/swift-1", "warm-up", "hello")  # imports, caches
            sys.setprofile(profile)
            threading.setprofile(profile)  # the store's work runs in worker threads
            try:
                shown = one_request(ledger, "acme/swift-1", "traced", "hello")
            finally:
                sys.setprofile(None)
                threading.setprofile(None)  # type: ignore[arg-type]
        finally:
            ledger.close()
    left: set[str] = set()
    returns = 0
    for before, after in itertools.pairwise(sequence):
        left.add(before)
        returns += after in left
    visits: dict[str, int] = defaultdict(int)
    for name in sequence:
        visits[name] += 1
    rel = {name: str(Path(name).relative_to(ROOT)) for name in visits}
    return {
        "status": shown.status,
        "files": len(visits),
        "returns_to_a_file_left": returns,
        "most_entered": [
            f"{rel[n]} ({c})" for n, c in sorted(visits.items(), key=lambda kv: -kv[1])[:5]
        ],
    }


def main() -> None:
    """Print the figures as text or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-trace", action="store_true", help="skip the traced gateway request")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    report = figures()
    if not args.no_trace:
        report["gateway_request"] = gateway_path()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"  {item}")
        elif isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {v}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
