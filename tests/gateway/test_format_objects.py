"""R-FMT-1: a wire format is one object, and no code outside `ledger/gateway/formats/` compares or
branches on which format it holds (issue 43). Every `ledger/` module is parsed and each comparison
(`==`, `!=`, `is`, `is not`, `in`, `not in`, a `match` case; `x is None` aside: whether a path has
a format at all, not which) and `isinstance` call is looked at: it fails when an operand names a
format (a registered format's name, path prefix or path as a string; the built-in format objects
or their classes; a value held as a format: `fmt`, `caller`, `route_format(...)`, `*.fmt`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from ledger.gateway.formats import registry
from ledger.gateway.formats.base import WireFormat

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ledger"
FORMATS = PACKAGE / "gateway" / "formats"

HELD = {"fmt", "caller", "format", "wire_format", "route_format", "caller_format"}
"""Names a format object is held under in the gateway."""
OBJECTS = {"Format", "OPENAI", "ANTHROPIC", "OPENAI_CHAT", "ANTHROPIC_MESSAGES", "FORMAT"}
"""The names the built-in format objects are known by."""


def _format_words() -> set[str]:
    words: set[str] = set()
    for fmt in registry.formats():
        words |= {fmt.name, fmt.prefix, fmt.path, fmt.prefix.strip("/")}
    return words


def _classes() -> set[str]:
    found: set[str] = set()
    todo: list[type] = [WireFormat]
    while todo:
        cls = todo.pop()
        found.add(cls.__name__)
        todo += cls.__subclasses__()
    return found


def _names(node: ast.AST) -> str | None:
    """The last identifier of a name, an attribute or a call's function, else None."""
    if isinstance(node, ast.Call):
        return _names(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _names_a_format(node: ast.AST, words: set[str]) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in words
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_format(e, words) for e in node.elts)
    if isinstance(node, ast.Attribute) and _names(node.value) in OBJECTS:
        return True  # Format.OPENAI and the like
    name = _names(node)
    return name is not None and (name in HELD or name in OBJECTS)


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def violations(tree: ast.AST, words: set[str], classes: set[str]) -> Iterator[tuple[int, str]]:
    """(line, source kind) of every comparison or isinstance naming a format."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if len(operands) == 2 and any(_is_none(o) for o in operands):
                continue  # whether there is a format at all: no branch on which one
            if any(_names_a_format(o, words) for o in operands):
                yield node.lineno, "comparison"
        elif isinstance(node, ast.match_case):
            pattern = node.pattern
            if isinstance(pattern, ast.MatchValue) and _names_a_format(pattern.value, words):
                yield pattern.lineno, "match case"
        elif (
            isinstance(node, ast.Call)
            and _names(node.func) == "isinstance"
            and len(node.args) == 2
        ):
            kinds = node.args[1]
            elts = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
            if any(_names(e) in classes for e in elts):
                yield node.lineno, "isinstance"


def found(package: Path) -> list[str]:
    words, classes = _format_words(), _classes()
    hits = []
    for path in sorted(package.rglob("*.py")):
        if FORMATS in path.parents:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for line, kind in violations(tree, words, classes):
            hits.append(f"{path.relative_to(ROOT)}:{line}: a {kind} on a wire format")
    return hits


def test_r_fmt_1_no_code_outside_the_formats_folder_compares_formats() -> None:
    assert found(PACKAGE) == []


def test_r_fmt_1_the_check_sees_each_kind_of_branch() -> None:
    """The check itself: each way a branch on a format was written before issue 43 is seen."""
    words, classes = _format_words(), _classes()
    branches = [
        "if fmt is Format.OPENAI: pass",
        "x = a if prepared.fmt is not prepared.caller else b",
        "ok = fmt is request.fmt",
        "if provider.api == 'anthropic-messages': pass",
        "if path.startswith('x') and kind in ('openai-chat',): pass",
        "if isinstance(f, OpenAIChat): pass",
        "match api:\n    case 'openai-chat': pass",
    ]
    for source in branches:
        assert list(violations(ast.parse(source), words, classes)), source
    fine = [
        "if body.get('stream') is True: pass",
        "if fmt.streams(body): pass",
        "if fmt is not None: pass",
    ]
    for source in fine:
        assert not list(violations(ast.parse(source), words, classes)), source
