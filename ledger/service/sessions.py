"""The page's sign-in sessions (R-SRV-10) and the sign-in page a browser without one sees.

`GET /?token=…` with the right token makes a session: a random value of its own (never the
bearer token: browsers send 127.0.0.1 cookies to every port of 127.0.0.1, RFC 6265 §8.5, so a
cookie reaches any local dev server), set HttpOnly, SameSite=Strict, expiring. A session opens
the page and its assets only, never `/v1/…`.

Invariant: at most `MAX_SESSIONS` sessions are kept (the oldest goes first) and each ends after
`SESSION_LIFETIME_S`; only a hash of each value is kept, looked up by that hash.
"""

from __future__ import annotations

import hashlib
import html
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

SESSION_COOKIE = b"ledger_page"
SESSION_LIFETIME_S = 12 * 3600
MAX_SESSIONS = 64
"""Sign-ins kept at once (a 65th ends the oldest): nothing a client sends grows without bound."""


class PageSessions:
    """Random page sessions with an expiry (see the module docstring)."""

    def __init__(
        self,
        lifetime_s: float = SESSION_LIFETIME_S,
        limit: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lifetime_s = lifetime_s
        self.limit = limit
        self.clock = clock
        self._ends: OrderedDict[bytes, float] = OrderedDict()  # hash of the value -> end

    def __len__(self) -> int:
        return len(self._ends)

    def new(self) -> bytes:
        """A new session's value (URL-safe ASCII, 256 random bits)."""
        self._prune()
        while len(self._ends) >= self.limit:
            self._ends.popitem(last=False)
        value = secrets.token_urlsafe(32).encode()
        self._ends[_key(value)] = self.clock() + self.lifetime_s
        return value

    def valid(self, value: bytes | None) -> bool:
        """Whether `value` is a live session's."""
        if not value:
            return False
        end = self._ends.get(_key(value))
        if end is None:
            return False
        if end <= self.clock():
            del self._ends[_key(value)]
            return False
        return True

    def cookie(self, value: bytes) -> bytes:
        """The Set-Cookie value for a session (the page only: HttpOnly, SameSite=Strict)."""
        return (
            SESSION_COOKIE + b"=" + value + b"; HttpOnly; SameSite=Strict; Path=/; Max-Age="
            + str(int(self.lifetime_s)).encode()
        )

    def _prune(self) -> None:
        now = self.clock()
        for key in [k for k, end in self._ends.items() if end <= now]:
            del self._ends[key]


def _key(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def sign_in_page(token_hint: str) -> bytes:
    """The small page an unauthenticated browser gets at `/` over TCP: how to sign in and where
    the token is (`token_hint`: the token file's path or the variable's name, never a token)."""
    where = html.escape(token_hint)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<title>ledger: sign in</title></head><body><h1>ledger</h1>"
        "<p>This page needs the service's bearer token once. Open "
        "<code>/?token=&lt;TOKEN&gt;</code> on this address with the token from "
        f"<code>{where}</code>; the page then keeps a session of its own (the token is not "
        "stored in the browser).</p></body></html>"
    ).encode()
