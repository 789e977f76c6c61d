"""Gateway keys (R-SC-3): pure parts — minting a key, its digest, its shape, its identity.

A key is `lgk_<id>_<secret>`: `id` (16 hex digits, public) finds its row in one read; `secret`
is 32 random bytes from `secrets`. The ledger stores only HMAC-SHA256(salt, key) under a random
16-byte salt of the key's own, never the key. A fast keyed hash is enough here: the key carries
256 bits of randomness, so there is nothing to guess that a slow hash (scrypt) would protect,
while a slow hash on every gateway request would cost tens of milliseconds of CPU each and be a
way to exhaust the service. Digests are compared with `hmac.compare_digest` (constant time), and
an unknown id is compared against a dummy so it takes the same work.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from ledger.config import SCOPE_NAME
from ledger.errors import UsageError

PREFIX = "lgk_"
_KEY = re.compile(r"lgk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
KEY_NAME = SCOPE_NAME
"""A key's name: short and plain like a scope's, so `key list` and errors can show it."""
_DUMMY_SALT = bytes(16)


@dataclass(frozen=True)
class KeyIdentity:
    """Who a verified key is: its name and the scopes its requests are put under."""

    name: str
    scopes: tuple[str, ...]


@dataclass(frozen=True)
class MintedKey:
    """A new key and what the ledger stores of it (the key itself is shown once, never kept)."""

    key: str
    key_id: str
    salt: str
    digest: str


def mint() -> MintedKey:
    """A fresh random key with its public id, salt and digest."""
    key_id = secrets.token_hex(8)
    key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    salt = secrets.token_bytes(16)
    return MintedKey(key, key_id, salt.hex(), digest(salt, key))


def digest(salt: bytes, key: str) -> str:
    """HMAC-SHA256 of the whole key under its salt, as hex."""
    return hmac.new(salt, key.encode(), hashlib.sha256).hexdigest()


def key_id_of(presented: object) -> str | None:
    """The public id of a presented key of the right shape, else None (nothing is looked up)."""
    if not isinstance(presented, str):
        return None
    match = _KEY.fullmatch(presented)
    return None if match is None else match[1]


def matches(presented: str, salt_hex: str | None, stored: str | None) -> bool:
    """Whether `presented` is the key behind `stored` (constant time; a missing row is
    compared against a dummy, so an unknown id costs the same work)."""
    salt = bytes.fromhex(salt_hex) if salt_hex is not None else _DUMMY_SALT
    expected = stored if stored is not None else "0" * 64
    return hmac.compare_digest(digest(salt, presented), expected) and stored is not None


def usable(now_ms: int, revoked_ms: int | None, expires_ms: int | None) -> bool:
    """A key opens the gateway until it is revoked or expires (at its expiry it is expired)."""
    return revoked_ms is None and (expires_ms is None or now_ms < expires_ms)


def state_of(now_ms: int, revoked_ms: int | None, expires_ms: int | None) -> str:
    """`active`, `revoked` or `expired`, for `key list`."""
    if revoked_ms is not None:
        return "revoked"
    if expires_ms is not None and now_ms >= expires_ms:
        return "expired"
    return "active"


def check_key_name(name: object) -> str:
    """A key name of the documented shape, or a usage error that does not echo it."""
    if not isinstance(name, str) or re.fullmatch(KEY_NAME, name) is None:
        raise UsageError(
            "a key name is 1-64 letters, digits, '.', '_', ':' or '-' (starting with a letter "
            "or digit)"
        )
    return name
