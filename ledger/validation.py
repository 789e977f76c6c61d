"""Turn a pydantic ValidationError into one fixed ConfigError line that never echoes a value.

Only schema field names and list indices are printed; dictionary keys chosen by the user (which
could be a pasted secret) are shown by position, never by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ledger.errors import ConfigError

_RULES = {
    "extra_forbidden": "unknown key (not allowed)",
    "missing": "required key is missing",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "greater_than": "must be greater than zero",
    "greater_than_equal": "must not be negative",
    "less_than_equal": "is too large",
    "string_too_short": "must not be empty",
    "string_too_long": "is too long",
    "too_long": "has too many entries",
    "literal_error": "is not one of the allowed values",
    "enum": "is not one of the allowed values",
    "finite_number": "must be a finite number",
    "json_invalid": "is not valid JSON",
    "json_type": "must be a JSON object",
    "string_pattern_mismatch": "has the wrong format",
    "none_required": "must be null",
}


def render_path(loc: Iterable[int | str], known_fields: frozenset[str]) -> str:
    """Render a pydantic location with only schema names and indices."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in known_fields:
            parts.append(("." if parts else "") + item)
        else:
            parts.append(("." if parts else "") + "<key>")
    return "".join(parts) or "(top level)"


def _fields(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    """Every alias and field name reachable from a model (the only names safe to print)."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names: set[str] = set()
    for name, field in model.model_fields.items():
        names.add(field.alias or name)
        for arg in _walk_types(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                names |= _fields(arg, seen)
    return names


def _walk_types(annotation: Any) -> Iterable[Any]:
    yield annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        yield from _walk_types(arg)


M = TypeVar("M", bound=BaseModel)


def parse_document(model: type[M], text: str | bytes, file: str) -> M:
    """Validate a JSON document against a strict model, or raise one ConfigError."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(file, "(top level)", "is not valid JSON") from exc
    if not isinstance(raw, dict):
        raise ConfigError(file, "(top level)", "must be a JSON object")
    try:
        return model.model_validate(raw, strict=True)
    except ValidationError as exc:
        err = exc.errors(include_input=False, include_url=False, include_context=False)[0]
        known = frozenset(_fields(model))
        loc = [x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-"))]
        rule = _RULES.get(err["type"])
        if rule is None and err["type"] == "value_error":
            # our own validators raise ValueError with fixed text prefixed "rule: "
            msg = str(err.get("msg", ""))
            rule = msg.split("rule: ", 1)[1] if "rule: " in msg else "is invalid"
        raise ConfigError(
            file, render_path(loc, known), rule or f"is invalid ({err['type']})"
        ) from None
    except RecursionError as exc:
        raise ConfigError(file, "(top level)", "is nested too deeply") from exc


def load_document(model: type[M], path: Path) -> M:
    """Read and validate a JSON file; a missing file means the model's defaults."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return model()
    except OSError as exc:
        raise ConfigError(str(path), "(file)", "cannot be read") from exc
    return parse_document(model, text, str(path))
