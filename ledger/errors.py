"""The LedgerError hierarchy: fixed messages, context as attributes, one exit code per class.

Messages never contain a configuration value, a credential, a provider's error body or model text.
"""

from __future__ import annotations


class LedgerError(Exception):
    """An error inside ledger."""

    exit_code = 1

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or type(self).__name__).strip())

    @property
    def message(self) -> str:
        """The one line shown to a user."""
        return str(self.args[0])


class UsageError(LedgerError):
    """Bad usage or bad input."""

    exit_code = 2


class ConfigError(UsageError):
    """A configuration file is invalid; the message names file, field path and rule, not a value."""

    def __init__(self, file: str, path: str, rule: str) -> None:
        self.file = file
        self.path = path
        self.rule = rule
        super().__init__(f"{file}: {path}: {rule}")


class NotFoundError(UsageError):
    """No such object in the ledger."""


class SourceScopeMismatch(UsageError):
    """the source is not under the gateway key's scopes; nothing reserved (R-SC-3a)"""


class Refused(LedgerError):
    """Refused by policy; `reason` is the reason code printed for the operator."""

    exit_code = 3

    def __init__(
        self,
        reason: str,
        detail: str = "",
        retry_at_ms: int | None = None,
        now_ms: int | None = None,
        scope: str | None = None,
    ) -> None:
        self.reason = reason
        self.detail = detail
        self.retry_at_ms = retry_at_ms
        self.now_ms = now_ms  # the ledger time of the refusal, when known
        self.scope = scope  # the scope that refused (R-SC-1); its name is in `detail` too
        super().__init__(f"refused: {reason}" + (f" ({detail})" if detail else ""))


class StoreError(LedgerError):
    """The database cannot be used."""

    exit_code = 4


class BusyError(StoreError):
    """database busy: the write lock was held past the busy timeout; nothing written, retry"""


SQLITE_BUSY = (
    "database busy: SQLite's own lock was held past the busy timeout (by a reader, or by a "
    "process outside ledger's write lock); nothing written, retry"
)
"""The same error when it was SQLite's lock, not ledger's write lock, that did not come free: a
stuck ledger writer and a `sqlite3` shell (or backup, or long reader) call for different fixes."""


class SchemaTooOldError(StoreError):
    """the database schema is older than this ledger; run `ledger db upgrade` (it backs up first)"""


class SchemaTooNewError(StoreError):
    """the database was written by a newer ledger; this version will not touch it"""


class UnreadableDatabaseError(StoreError):
    """the database file is not a ledger database or cannot be read; it was left untouched"""


class StorageFullError(StoreError):
    """the database could not grow (disk or page limit full); the transaction was rolled back"""


class ReadOnlyError(StoreError):
    """the database or its directory is read-only; nothing was written"""


class BadDatabaseUrlError(UsageError):
    """the database URL is not a supported SQLite path or postgresql+psycopg:// URL"""


class MissingDriverError(UsageError):
    """PostgreSQL needs the psycopg driver: python -m pip install -e '.[postgres]' (checkout)"""


class DatabaseUnreachableError(StoreError):
    """the database server cannot be reached or refused the connection; nothing was written"""


class ServiceRunningError(StoreError):
    """another `ledger serve` is already running on this state directory"""


class ServiceUnreachableError(StoreError):
    """the ledger service cannot be reached (is `ledger serve` running?); nothing was written"""
