"""Turn a pydantic ValidationError into one fixed ConfigError line that never echoes a value.

Only schema field names and list indices are printed; dictionary keys chosen by the user (which
could be a pasted secret) are shown as `<key>`, never by name — except an unknown key that is a
plausible identifier (short, `[A-Za-z0-9_]`): that is a typo the user must find, and the nearest
known key is suggested. Invalid JSON is placed by line and column, never quoted.

`Derived` is the typed cache a loaded document (a policy, a catalog) owns: the values other modules
work out from that frozen document once and keep for its lifetime.
"""


from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import AfterValidator, BaseModel, ValidationError

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


_IDENTIFIER = re.compile(r"[a-z]+(?:[A-Z][a-z]*)*|[a-z]+(?:_[a-z]+)*")
"""A field name as people type one: camelCase or snake_case words, no digits. A credential
pasted as a key (`AKIA…`, `sk_live_…`, hex tokens) is random-looking and is never shown."""
_IDENTIFIER_MAX = 32


def render_path(
    loc: Iterable[int | str], known_fields: frozenset[str], shown_last: str | None = None
) -> str:
    """Render a pydantic location with only schema names, indices and, as its last item,
    `shown_last` (a plausible identifier) when given."""
    items = list(loc)
    parts: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in known_fields or (i == len(items) - 1 and item == shown_last):
            parts.append(("." if parts else "") + item)
        else:
            parts.append(("." if parts else "") + "<key>")
    return "".join(parts) or "(top level)"


def plausible_key(key: object) -> str | None:
    """The key when it looks like a field name someone mistyped (short camelCase or snake_case
    words, R-CFG-3: a key may be a pasted secret, so anything random-looking stays hidden)."""
    if not isinstance(key, str) or len(key) > _IDENTIFIER_MAX:
        return None
    return key if _IDENTIFIER.fullmatch(key) else None


def _level_fields(model: type[BaseModel], loc: list[int | str]) -> set[str]:
    """The field names of the object at `loc` (the parent of the last item), for suggestions."""
    current: type[BaseModel] | None = model
    for item in loc[:-1]:
        if current is None:
            return set()
        if isinstance(item, int):
            continue
        field = next(
            (f for n, f in current.model_fields.items() if item in (n, f.alias)), None
        )
        if field is None:
            continue  # a user-chosen dictionary key: the value's model follows
        current = next(
            (
                t
                for t in _walk_types(field.annotation)
                if isinstance(t, type) and issubclass(t, BaseModel)
            ),
            None,
        )
    if current is None:
        return set()
    return {f.alias or n for n, f in current.model_fields.items()}


def _unknown_key_rule(model: type[BaseModel], loc: list[int | str]) -> str:
    rule = _RULES["extra_forbidden"]
    key = loc[-1] if loc else None
    if not isinstance(key, str):
        return rule
    near = difflib.get_close_matches(key, sorted(_level_fields(model, loc)), n=1, cutoff=0.6)
    return f"{rule}; did you mean `{near[0]}`?" if near else rule


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


def _floor_rule(exc: ValidationError) -> str:
    """`must be at least N` for a schema floor above zero (N is the schema's, never the input)."""
    floor = (exc.errors(include_input=False, include_url=False)[0].get("ctx") or {}).get("ge")
    if isinstance(floor, int) and not isinstance(floor, bool) and floor > 0:
        return f"must be at least {floor}"
    return _RULES["greater_than_equal"]


def printable_text(value: str) -> str:
    """A name or URL that reaches terminals: no control or format character (an ANSI escape in
    an imported key must never be printed raw); refused with a fixed rule, never echoed."""
    if not value.isprintable():
        raise ValueError("rule: must not contain control or format characters")
    return value


Printable = AfterValidator(printable_text)
"""Annotate a `str` field (or dictionary key) with this to refuse non-printable characters."""

M = TypeVar("M", bound=BaseModel)

_AT = "at-path "
TAG = "tag-"
"""Prefix of union tags (`Tag(TAG + "spec")`): location items that are no field and not shown."""
_HIDDEN_LOC = ("function-", TAG)


def located(path: str, rule: str) -> ValueError:
    """A validator's error for a field path of its own choosing (a cross-field rule): `path`
    holds only schema names, indices and `<key>`, never a value."""
    return ValueError(f"{_AT}{path} rule: {rule}")


def parse_document(model: type[M], text: str | bytes, file: str) -> M:
    """Validate a JSON document against a strict model, or raise one ConfigError."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:  # the parser's fixed text, never the document's
        where = f"line {exc.lineno}, column {exc.colno}"
        why = exc.msg.removesuffix(" at").lower()  # "Invalid control character at"
        raise ConfigError(file, where, f"is not valid JSON ({why})") from exc
    except (ValueError, RecursionError) as exc:
        raise ConfigError(file, "(top level)", "is not valid JSON") from exc
    return validate_document(model, raw, file)


def validate_document(
    model: type[M], raw: object, file: str, root: type[BaseModel] | None = None,
    at: tuple[int | str, ...] = (),
) -> M:
    """Validate parsed JSON against a strict model, or raise one ConfigError. A part of a
    larger document (one item of a streamed list) passes the document's model as `root` and
    its place in it as `at`, so the error names the field as in the whole document."""
    if not at and not isinstance(raw, dict):
        raise ConfigError(file, "(top level)", "must be a JSON object")
    try:
        return model.model_validate(raw, strict=True)
    except ValidationError as exc:
        raise config_error(root or model, exc, file, at) from None
    except RecursionError as exc:
        raise ConfigError(file, "(top level)", "is nested too deeply") from exc


def config_error(
    model: type[BaseModel], exc: ValidationError, file: str, at: tuple[int | str, ...] = ()
) -> ConfigError:
    """The one line for a validation error of `model` (the whole document's) at `at`."""
    err = exc.errors(include_input=False, include_url=False, include_context=False)[0]
    known = frozenset(_fields(model))
    loc = [*at] + [
        x for x in err["loc"] if not (isinstance(x, str) and x.startswith(_HIDDEN_LOC))
    ]
    rule = _RULES.get(err["type"])
    if err["type"] == "greater_than_equal":
        rule = _floor_rule(exc)
    shown = None
    if err["type"] == "extra_forbidden":
        shown = plausible_key(loc[-1]) if loc else None
        rule = _unknown_key_rule(model, loc)
    if rule is None and err["type"] == "value_error":
        # our own validators raise ValueError with fixed text prefixed "rule: "
        msg = str(err.get("msg", ""))
        rule = msg.split("rule: ", 1)[1] if "rule: " in msg else "is invalid"
        if _AT in msg:  # a cross-field rule names its own path
            where = msg.split(_AT, 1)[1].split(" rule: ", 1)[0]
            return ConfigError(file, where, rule)
    return ConfigError(
        file, render_path(loc, known, shown), rule or f"is invalid ({err['type']})"
    )


def load_document(model: type[M], path: Path) -> M:
    """Read and validate a JSON file; a missing file means the model's defaults."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return model()
    except OSError as exc:
        raise ConfigError(str(path), "(file)", "cannot be read") from exc
    return parse_document(model, text, str(path))


MASK = "***"

_TOKEN_LIKE = re.compile(r"(?=.*[0-9])(?=.*[A-Za-z])[^/]{20,}")
"""A path segment that may be a credential (`/bot<token>/`): 20+ characters mixing letters and
digits. Model and deployment names are shorter or contain no digit; a false match only hides a
segment from display."""


def printable(text: str) -> str:
    """`text` with every non-printable character (control, format, separator) shown as `?`."""
    return "".join(c if c.isprintable() else "?" for c in text)


def shown_url(url: str) -> str:
    """`url` for a terminal or JSON output: scheme, host, port and path are kept; the userinfo
    (a `user:password@` or a bare token `sk-…@`), every query value, a query key that is not a
    short name, the fragment and token-like path segments become `***`. An unparseable URL is
    shown as its scheme and `***`."""
    scheme = url.partition("://")[0] if "://" in url else ""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a malformed port
    except ValueError:
        return printable(f"{scheme}://{MASK}" if scheme else MASK)
    _userinfo, at, host = parts.netloc.rpartition("@")
    netloc = f"{MASK}@{host}" if at else host
    path = "/".join(MASK if _TOKEN_LIKE.fullmatch(s) else s for s in parts.path.split("/"))
    query = "&".join(_masked_pair(p) for p in parts.query.split("&")) if parts.query else ""
    fragment = MASK if parts.fragment else ""
    return printable(urlunsplit((parts.scheme, netloc, path, query, fragment)))


_QUERY_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,31}")


def _masked_pair(pair: str) -> str:
    key, eq, _value = pair.partition("=")
    shown_key = key if _QUERY_KEY.fullmatch(key) and not _TOKEN_LIKE.fullmatch(key) else MASK
    return f"{shown_key}={MASK}" if eq else MASK


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DERIVED_BOUND = 100_000
"""Values a `Derived` holds before bounded slots stop keeping new ones (their keys come from
requests: primaries and tried sets, not only from the document)."""


@dataclass(frozen=True, eq=False)
class Slot(Generic[K, V]):
    """One kind of value in a `Derived` cache: keys of type K map to values of type V. Declared
    once, next to the code that works the value out; compared by identity."""

    name: str
    bounded: bool = False  # kept only while the cache holds fewer than DERIVED_BOUND values


class Derived:
    """The values worked out from one loaded document (a frozen policy or catalog) on first use,
    kept for that object's lifetime: a reloaded document is a new object with an empty cache.

    Its owner holds it as a private attribute made by its own default factory; readers go through
    `value` with a typed `Slot`, so each kind of value has one declared type.
    """

    __slots__ = ("_count", "_values")

    def __init__(self) -> None:
        self._values: dict[Slot[Any, Any], dict[Any, Any]] = {}
        self._count = 0

    def value(
        self,
        slot: Slot[K, V],
        key: K,
        make: Callable[[], V],
        fresh: Callable[[V], bool] | None = None,
    ) -> V:
        """The kept value of `slot` for `key`, else `make()` kept (a bounded slot keeps it only
        below DERIVED_BOUND values). `fresh` rejects a kept value made from other inputs than
        the caller's (a copy of the owner shares its cache): it is made again and replaced."""
        values = self._values.setdefault(slot, {})
        if key in values:
            found: V = values[key]
            if fresh is None or fresh(found):
                return found
        made = make()
        if key in values:
            values[key] = made
        elif not slot.bounded or self._count < DERIVED_BOUND:
            values[key] = made
            self._count += 1
        return made

    def __len__(self) -> int:
        return self._count

    def __eq__(self, other: object) -> bool:
        """Caches are alike: two documents compare by their fields, never by what was derived
        from them so far (pydantic compares private attributes too)."""
        return isinstance(other, Derived)
