"""ledger: a SQLite-backed budget and recovery ledger for background LLM jobs."""

from __future__ import annotations

from ledger.api import Ledger
from ledger.classify import Classification, classify_exception, classify_http, classify_kind
from ledger.errors import LedgerError, NotFoundError, Refused, UsageError
from ledger.kinds import AttemptRole, ExclusionReason, FailureKind, RefusalReason
from ledger.records import Cancelled, Failed, Reservation, SettleResult, Success

__version__ = "0.1.0"

__all__ = [
    "AttemptRole",
    "Cancelled",
    "Classification",
    "ExclusionReason",
    "Failed",
    "FailureKind",
    "Ledger",
    "LedgerError",
    "NotFoundError",
    "RefusalReason",
    "Refused",
    "Reservation",
    "SettleResult",
    "Success",
    "UsageError",
    "classify_exception",
    "classify_http",
    "classify_kind",
]
