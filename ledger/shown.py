"""What may reach a terminal or a JSON document from configuration text (issue 20 items 10, 11).

Invariant: a URL is shown only through `shown_url` (every part that can carry a credential is
`***`) and free text only through `printable` (no control character reaches a terminal).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

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
