"""What the worker needs of a ledger: `Ledger` (in process) and `LedgerClient` (over the service)
both provide it, so `ledger worker run` runs against either (R-SRV-7)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from ledger.catalog import Catalog, Model
from ledger.config import Policy
from ledger.kinds import AttemptRole, FailureKind
from ledger.records import Outcome, Reservation, SettleResult
from ledger.store.queue import Claim, CommitFailure, QueueTimes
from ledger.store.token_views import TokenWindowUse

if TYPE_CHECKING:
    from ledger.routing.select import Selection


class WorkerLedger(Protocol):
    """Policy, catalog and environment read once, the call methods and the queue's lease methods."""

    @property
    def policy(self) -> Policy: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def clock_fn(self) -> Callable[[], int]: ...

    def model(self, key: str) -> Model: ...

    def reserve(
        self,
        source: str,
        model: str,
        *,
        input_bytes: int | None = None,
        text: str | None = None,
        request_id: str | None = None,
        override: bool = False,
        role: AttemptRole = AttemptRole.PRIMARY,
        fallback_from: str | None = None,
        after: int | None = None,
    ) -> Reservation: ...

    def settle(
        self, reservation_id: int, outcome: Outcome, *, overran: bool = False
    ) -> SettleResult: ...

    def select(
        self,
        source: str | None,
        *,
        model: str | None = None,
        input_bytes: int | None = None,
        text: str | None = None,
        after_failure: FailureKind | None = None,
        failed_model: str | None = None,
        tried: frozenset[str] = frozenset(),
    ) -> Selection: ...

    def claim(
        self, worker_id: str, *, checked_before: int | None = None,
        skip_scopes: Iterable[str] = (),
    ) -> Claim | None: ...

    def token_windows(self) -> list[TokenWindowUse]: ...

    def renew(
        self, source: str, worker_id: str, *, cover_until_ms: int = 0, unpaused: bool = False
    ) -> bool: ...

    def finish(self, source: str, worker_id: str) -> bool: ...

    def release(self, source: str, worker_id: str) -> bool: ...

    def release_spent(self, source: str, worker_id: str) -> str | None: ...

    def defer_owed_fallback(self, source: str, worker_id: str) -> int | None: ...

    def commit_failed(self, source: str, worker_id: str, model: str) -> CommitFailure | None: ...

    def queue_times(self) -> QueueTimes: ...

    def ledger_now(self) -> int: ...

    def compact(self, batch: int) -> int: ...

    def close(self) -> None: ...
