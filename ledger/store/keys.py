"""Gateway keys in the store (R-SC-3): create, list, revoke, verify — each one transaction.

Only a key's name, scopes, times, public id, salt and digest are written; the key itself never
reaches the database. `verify` is one read (the row by the key's public id) and a constant-time
comparison; a key that verifies has its `last_used_ms` moved on at most once a minute, in a write
transaction of its own that gives way to a busy ledger (it is a note for `key list`, not a
budget). A service hands that write to `LastUsed`, which makes it in a thread of its own, never
before the answer (R-GW-8); the notes made while one write waits are coalesced into the next.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import bindparam, insert, select, update

from ledger import keys
from ledger.errors import BusyError, NotFoundError, StoreError, UsageError
from ledger.keys import KeyIdentity
from ledger.store.engine import Database
from ledger.store.pending import rehearsed
from ledger.store.schema import gateway_keys

LAST_USED_EVERY_MS = 60_000
_K = gateway_keys.c
_BY_KEY_ID = select(
    _K.name, _K.salt, _K.digest, _K.scopes, _K.expires_ms, _K.revoked_ms, _K.last_used_ms
).where(_K.key_id == bindparam("key_id"))
_BY_NAME = select(_K.name).where(_K.name == bindparam("name"))
_TOUCH = (
    update(gateway_keys)
    .where(
        _K.name == bindparam("b_name"),
        (_K.last_used_ms.is_(None)) | (_K.last_used_ms < bindparam("b_now")),
    )
    .values(last_used_ms=bindparam("b_now"))
)


@dataclass(frozen=True)
class KeyRow:
    """What `key list` shows of a key (never the key, its salt or its digest)."""

    name: str
    scopes: tuple[str, ...]
    created_ms: int
    expires_ms: int | None
    revoked_ms: int | None
    last_used_ms: int | None


def _scopes(text: str) -> tuple[str, ...]:
    return tuple(text.split()) if text else ()


@rehearsed
def create_key(
    db: Database, name: str, scopes: tuple[str, ...], expires_in_ms: int | None
) -> tuple[str, KeyRow]:
    """Store a new key under `name` (which must be free); the key, shown once, and its row."""
    minted = keys.mint()
    with db.write() as txn:
        if txn.conn.execute(_BY_NAME, {"name": name}).first() is not None:
            raise UsageError("a key with this name exists; revoke it or choose another name")
        expires = None if expires_in_ms is None else txn.now + expires_in_ms
        txn.conn.execute(
            insert(gateway_keys).values(
                name=name,
                key_id=minted.key_id,
                salt=minted.salt,
                digest=minted.digest,
                scopes=" ".join(scopes),
                created_ms=txn.now,
                expires_ms=expires,
            )
        )
        return minted.key, KeyRow(name, scopes, txn.now, expires, None, None)


def list_keys(db: Database) -> tuple[int, list[KeyRow]]:
    """Ledger time now and every key, by name."""
    with db.read() as conn:
        now = db.read_now(conn)
        found = conn.execute(
            select(
                _K.name, _K.scopes, _K.created_ms, _K.expires_ms, _K.revoked_ms, _K.last_used_ms
            ).order_by(_K.name)
        ).all()
    return now, [
        KeyRow(r.name, _scopes(r.scopes), r.created_ms, r.expires_ms, r.revoked_ms,
               r.last_used_ms)
        for r in found
    ]


@rehearsed
def revoke_key(db: Database, name: str) -> int:
    """End a key at once (every service reads it on every request); when it was revoked."""
    with db.write() as txn:
        row = txn.conn.execute(
            select(_K.revoked_ms).where(_K.name == name)
        ).first()
        if row is None:
            raise NotFoundError("unknown key")
        if row.revoked_ms is not None:
            return int(row.revoked_ms)
        txn.conn.execute(update(gateway_keys).where(_K.name == name).values(revoked_ms=txn.now))
        return txn.now


Touch = Callable[[str, int], None]
"""Told a verified key's name and the time when its `last_used_ms` is due to move on."""


def verify_key(
    db: Database, presented: object, touch: Touch | None = None
) -> KeyIdentity | None:
    """The identity of a usable key, else None (unknown, revoked, expired or malformed). Its
    last use is written here, or handed to `touch` (e.g. `LastUsed.note`) when one is given."""
    key_id = keys.key_id_of(presented)
    if key_id is None:
        return None
    assert isinstance(presented, str)
    with db.read() as conn:
        row = conn.execute(_BY_KEY_ID, {"key_id": key_id}).first()
    now = db.clock_fn()
    salt, stored = (None, None) if row is None else (str(row.salt), str(row.digest))
    same = keys.matches(presented, salt, stored)  # compared even when no row was found
    if row is None or not same:
        return None
    if not keys.usable(now, row.revoked_ms, row.expires_ms):
        return None
    if row.last_used_ms is None or now - int(row.last_used_ms) >= LAST_USED_EVERY_MS:
        if touch is None:
            with contextlib.suppress(BusyError):  # a busy ledger is not kept waiting for it
                _touch(db, {str(row.name): now})
        else:
            touch(str(row.name), now)
    return KeyIdentity(str(row.name), _scopes(str(row.scopes)))


def _touch(db: Database, due: dict[str, int]) -> None:
    """Move the keys' `last_used_ms` on, in one write transaction."""
    with db.write() as txn:
        for name, now in due.items():
            txn.conn.execute(_TOUCH, {"b_name": name, "b_now": max(now, txn.now)})


class LastUsed:
    """A service's last-used writes (R-GW-8): `note` only records what is due and returns; one
    daemon thread at a time writes everything noted, in one transaction, and looks again. A
    write held up by another writer's lock coalesces the notes made meanwhile; one that fails
    (busy past the timeout, the database gone) is dropped: a later use notes the key again."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._due: dict[str, int] = {}
        self._guard = threading.Lock()
        self._writing = False

    def note(self, name: str, now: int) -> None:
        """The key `name` was used at `now`: written soon, off the caller's thread."""
        with self._guard:
            self._due[name] = max(now, self._due.get(name, now))
            if self._writing:
                return
            self._writing = True
        threading.Thread(target=self._write, name="ledger-key-last-used", daemon=True).start()

    def _write(self) -> None:
        while True:
            with self._guard:
                due, self._due = self._due, {}
                if not due:
                    self._writing = False
                    return
            with contextlib.suppress(StoreError):  # a note, not a budget: dropped, never raised
                _touch(self.db, due)
