"""Connection pools and bounded logging for the service's HTTP layer (R-SRV-9).

Every connection is in one pool with its own limit: `unix` (the socket's clients, authenticated
by the file permission), `unauthenticated` (TCP connections that have not yet shown the bearer
token, a gateway key or a page session) and `tcp` (TCP connections that have). Strangers can fill
only the `unauthenticated` pool, whose members are also cut after a short deadline, so they never
use up the capacity kept for the socket's clients or for authenticated TCP clients.

A TCP connection arriving while `unauthenticated` is full is not reset: it joins `overflow`
(as large as `tcp`, the same deadline), where its first request's head is read and judged. With
a credential it moves to `tcp` like any other; without one it gets its answer (401) and is
closed, so a stranger there has one request, never a keep-alive. A burst of authenticated
callers (a job fanning out) is thus answered, up to the `tcp` pool's size, and refused past it
with 503 `too_many_connections` and Retry-After in the path's error shape, never reset. Only
past `overflow` too is a connection refused unread: a JSON 503 `too_many_connections` at once.

The HTTP layer's own log lines (malformed requests, connections refused over a limit) go through
`BoundedLog`: at most `LOG_BURST` lines per `LOG_WINDOW_S`, then one line with the count of those
left out, so a stream of bad requests writes a bounded number of lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

UNIX = "unix"
TCP = "tcp"
UNAUTHENTICATED = "unauthenticated"
OVERFLOW = "overflow"
CONNECTION_LIMITS: Mapping[str, int] = {UNIX: 1000, TCP: 500, UNAUTHENTICATED: 100, OVERFLOW: 500}
UNAUTHENTICATED_DEADLINE_S = 5.0
"""A TCP connection that has not authenticated within this (from its start) is closed."""
LOG_WINDOW_S = 60.0
LOG_BURST = 10


class Member(Protocol):
    """A connection as the pools see it."""

    def authenticated(self) -> None:
        """Told once when it moves from `unauthenticated` (or `overflow`) to `tcp`."""


Client = tuple[str, int]


class ConnectionPools:
    """Which pool each live connection is in (see the module docstring)."""

    def __init__(self, limits: Mapping[str, int] = CONNECTION_LIMITS) -> None:
        self.limits = dict(limits)
        self.members: dict[str, set[Member]] = {name: set() for name in self.limits}
        self._pool: dict[Member, str] = {}
        self._by_client: dict[Client, Member] = {}

    def count(self, pool: str) -> int:
        """Live connections in `pool`."""
        return len(self.members[pool])

    def join(self, member: Member, pool: str, client: Client | None) -> bool:
        """Add a new connection to `pool`; False (not added) when the pool is full."""
        if len(self.members[pool]) >= self.limits[pool]:
            return False
        self.members[pool].add(member)
        self._pool[member] = pool
        if client is not None:
            self._by_client[client] = member
        return True

    def leave(self, member: Member, client: Client | None) -> None:
        """A connection ended."""
        pool = self._pool.pop(member, None)
        if pool is not None:
            self.members[pool].discard(member)
        if client is not None and self._by_client.get(client) is member:
            del self._by_client[client]

    def authenticated(self, client: Client | None) -> bool:
        """The TCP connection from `client` showed a credential: it moves to the `tcp` pool.
        False when that pool is full (the request is then answered 503); True for a connection
        the pools do not know (not served by this HTTP layer)."""
        member = self._by_client.get(client) if client is not None else None
        pool = None if member is None else self._pool.get(member)
        if member is None or pool not in (UNAUTHENTICATED, OVERFLOW):
            return True
        if len(self.members[TCP]) >= self.limits[TCP]:
            return False
        self.members[pool].discard(member)
        self.members[TCP].add(member)
        self._pool[member] = TCP
        member.authenticated()
        return True


class BoundedLog(logging.Filter):
    """A logger filter letting at most `burst` records through per `window_s`; the first record
    after a window with records left out says how many (see the module docstring)."""

    def __init__(
        self,
        window_s: float = LOG_WINDOW_S,
        burst: int = LOG_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.window_s = window_s
        self.burst = burst
        self.clock = clock
        self._window_start = -float("inf")
        self._passed = 0
        self.left_out = 0
        self.total_left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        if now - self._window_start >= self.window_s:
            self._window_start = now
            self._passed = 0
        if self._passed >= self.burst:
            self.left_out += 1
            self.total_left_out += 1
            return False
        self._passed += 1
        if self.left_out:
            record.msg = f"{record.getMessage()} ({self.left_out} similar lines left out before)"
            record.args = None
            self.left_out = 0
        return True
