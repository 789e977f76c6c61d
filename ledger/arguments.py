"""Checks on the arguments of the public `Ledger` API (SPEC 15, issue 20 item 17).

Invariant: a wrong type or value is one `UsageError` line that names the parameter and what it
must be — never the value — and is raised before any transaction opens; what passes is of the
documented type (an integer stays an integer: `0.4` bytes is never stored as a real number).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import TypeVar

from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.errors import UsageError

MAX_INPUT_BYTES = 1 << 40
MAX_ID = 2**63 - 1
"""The largest id a reservation can have (a signed 64-bit integer on every backend)."""
SOURCE_ACTIONS = ("pause", "resume", "done")

E = TypeVar("E", bound=StrEnum)


def _kind(value: object) -> str:
    """The type of a wrong value (a type name is not a value: safe to show)."""
    return type(value).__name__


def check_flag(value: object, name: str) -> bool:
    """A True/False argument (1, "yes" and None are refused, not read as truthy)."""
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, not {_kind(value)}")
    return value


def check_str(value: object, name: str) -> str:
    """A text argument (a model key, a provider name)."""
    if not isinstance(value, str):
        raise UsageError(f"{name} must be a str, not {_kind(value)}")
    return value


def check_optional_str(value: object, name: str) -> str | None:
    """Text or None."""
    return None if value is None else check_str(value, name)


def check_int(value: object, name: str) -> int:
    """An integer (never a bool or a float, even a whole one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an int, not {_kind(value)}")
    return value


def check_reservation_id(value: object, name: str) -> int | None:
    """A reservation id: an int; None when it is out of every backend's range (no such row)."""
    number = check_int(value, name)
    return number if 0 < number <= MAX_ID else None


def check_source_id(source_id: object) -> str:
    """A source id is 1-200 printable characters."""
    if (
        not isinstance(source_id, str)
        or not 1 <= len(source_id) <= 200
        or not source_id.isprintable()
    ):
        raise UsageError("a source id must be 1 to 200 printable characters")
    return source_id


def check_request_id(request_id: object) -> str | None:
    """A request id is 1-200 printable characters (or absent)."""
    if request_id is None:
        return None
    if (
        not isinstance(request_id, str)
        or not 1 <= len(request_id) <= 200
        or not request_id.isprintable()
    ):
        raise UsageError("a request id must be a str of 1 to 200 printable characters")
    return request_id


def check_payload_ref(payload_ref: object) -> str | None:
    """An opaque payload reference: at most 1000 printable characters (or absent)."""
    if payload_ref is None:
        return None
    if not isinstance(payload_ref, str) or len(payload_ref) > 1000 or not payload_ref.isprintable():
        raise UsageError("a payload reference must be a str of at most 1000 printable characters")
    return payload_ref


def request_size(input_bytes: object, text: object) -> int:
    """Conservative input size in bytes from a byte count or the text itself."""
    if text is not None:
        if not isinstance(text, str):
            raise UsageError(f"text must be a str (the request text), not {_kind(text)}")
        return len(text.encode("utf-8", errors="surrogatepass"))
    if input_bytes is None:
        return 0
    if isinstance(input_bytes, bool) or not isinstance(input_bytes, int):
        raise UsageError(f"input bytes must be a non-negative int, not {_kind(input_bytes)}")
    if not 0 <= input_bytes <= MAX_INPUT_BYTES:
        raise UsageError("input bytes must be a non-negative int")
    return input_bytes


def check_enum(enum: type[E], value: object, name: str) -> E:
    """A member of `enum`, or one of its values as text."""
    if isinstance(value, enum):
        return value
    if isinstance(value, str) and value in enum._value2member_map_:
        return enum(value)
    raise UsageError(f"{name} must be one of: {', '.join(m.value for m in enum)}")


def check_optional_enum(enum: type[E], value: object, name: str) -> E | None:
    """A member of `enum` or None."""
    return None if value is None else check_enum(enum, value, name)


def check_keys(value: object, name: str) -> frozenset[str]:
    """A collection of model keys (a set, list or tuple; a lone str is refused, not split)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise UsageError(f"{name} must be a collection of model keys, not {_kind(value)}")
    keys = tuple(value)
    if not all(isinstance(k, str) for k in keys):
        raise UsageError(f"{name} must hold model keys (str)")
    return frozenset(keys)


def check_source_action(action: object) -> str:
    """pause, resume or done."""
    if not isinstance(action, str) or action not in SOURCE_ACTIONS:
        raise UsageError(f"a source action must be one of: {', '.join(SOURCE_ACTIONS)}")
    return action


def check_open(
    home: object,
    db: object,
    policy: object,
    catalog: object,
    env: object,
    clock: object,
    jitter: object,
    create: object,
) -> None:
    """The arguments of `Ledger.open`, checked before anything is resolved or created."""
    if home is not None and not isinstance(home, str | os.PathLike):
        raise UsageError(f"home must be a path (str or Path), not {_kind(home)}")
    check_optional_str(db, "db")
    for value, kind, name in ((policy, Policy, "policy"), (catalog, Catalog, "catalog")):
        if value is not None and not isinstance(value, kind):
            raise UsageError(f"{name} must be a {kind.__name__}, not {_kind(value)}")
    if env is not None and not isinstance(env, Mapping):
        raise UsageError(f"env must be a mapping of variable names to values, not {_kind(env)}")
    for fn, name in ((clock, "clock"), (jitter, "jitter")):
        if (fn is not None or name == "jitter") and not callable(fn):
            raise UsageError(f"{name} must be a function, not {_kind(fn)}")
    check_flag(create, "create")
