"""The library API: open a ledger, reserve, settle, select; thin glue over store and pure core."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ledger.budgets import ceiling_micro
from ledger.catalog import Catalog, Model, load_catalog
from ledger.config import Policy, load_policy
from ledger.db_target import check_db_target
from ledger.errors import NotFoundError, UsageError
from ledger.home import StateDir, ensure_home, state_dir
from ledger.kinds import AttemptRole, CooldownScope, FailureKind
from ledger.records import Outcome, Reservation, SettleResult
from ledger.store import Database, Store, migrate
from ledger.store import queue as store_queue
from ledger.store.reservations import ReserveRequest

if TYPE_CHECKING:
    from ledger.select import Selection

MAX_INPUT_BYTES = 1 << 40


def check_source_id(source_id: str) -> str:
    """A source id is 1-200 printable characters."""
    if not isinstance(source_id, str) or not 1 <= len(source_id) <= 200:
        raise UsageError("a source id must be 1 to 200 printable characters")
    if not source_id.isprintable():
        raise UsageError("a source id must be 1 to 200 printable characters")
    return source_id


def check_request_id(request_id: str | None) -> str | None:
    """A request id is 1-200 printable characters (or absent)."""
    if request_id is None:
        return None
    if not 1 <= len(request_id) <= 200 or not request_id.isprintable():
        raise UsageError("a request id must be 1 to 200 printable characters")
    return request_id


def request_size(input_bytes: int | None, text: str | None) -> int:
    """Conservative input size in bytes from a byte count or the text itself."""
    if text is not None:
        return len(text.encode("utf-8"))
    if input_bytes is None:
        return 0
    if isinstance(input_bytes, bool) or not 0 <= input_bytes <= MAX_INPUT_BYTES:
        raise UsageError("input bytes must be a non-negative integer")
    return input_bytes


@dataclass
class Ledger:
    """One process's view of a shared ledger: policy and catalog read once, the store, the clock."""

    state: StateDir
    policy: Policy
    catalog: Catalog
    store: Store
    env: Mapping[str, str]
    _fp: tuple[Policy, str] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def open(
        cls,
        home: str | Path | None = None,
        db: str | None = None,
        *,
        policy: Policy | None = None,
        catalog: Catalog | None = None,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], int] | None = None,
        jitter: Callable[[], float] = random.random,
        create: bool = True,
    ) -> Ledger:
        """Resolve the state dir, read policy and catalog once (R-HOME-3), check the schema.

        With `create=False` (read-only commands) nothing is created: a missing state directory or
        database file is a `NoLedgerError` (exit 4).
        """
        state = state_dir(None if home is None else str(home), db)
        check_db_target(state.db_url, create=create, home=state.path.absolute())
        if create:
            ensure_home(state.path)
        policy = policy if policy is not None else load_policy(state.path)
        catalog = catalog if catalog is not None else load_catalog(state.path)
        database = Database(state.db_url, busy_timeout_ms=policy.busy_timeout_ms, clock_fn=clock)
        try:
            migrate.open_checked(database, create=create)
        except BaseException:
            database.dispose()
            raise
        return cls(
            state, policy, catalog, Store(database, jitter), os.environ if env is None else env
        )

    @property
    def db(self) -> Database:
        """The database handle."""
        return self.store.db

    @property
    def fingerprint(self) -> str:
        """This process's policy fingerprint (stamped on every reservation it writes)."""
        cached = self._fp
        if cached is None or cached[0] is not self.policy:  # computed once per policy object
            cached = self._fp = (self.policy, self.policy.fingerprint())
        return cached[1]

    def model(self, key: str) -> Model:
        """A catalog model or a usage error."""
        return self.catalog.require_model(key)

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
    ) -> Reservation:
        """Permission for one call, or `Refused` with its reason code (SPEC section 7).

        `after` names the failed reservation an immediate fallback or correction follows. Only
        the one follow-up that failure's decision permitted is honoured (a fallback to another
        model, a correction on the same one), only while it is the source's newest reservation,
        and never after a follow-up; the ledger then records the role itself and the backoff that
        failure set does not block it (every other check still applies). `role` and
        `fallback_from` are checked against the ledger, never trusted; the privacy boundary
        (route rules, crossProviderFallback, fallbackModels) applies to every reserve.
        """
        if after is not None and (isinstance(after, bool) or not isinstance(after, int)):
            raise UsageError("after must be a reservation id")
        request = ReserveRequest(
            source_id=check_source_id(source),
            model=self.model(model),
            input_bytes=request_size(input_bytes, text),
            request_id=check_request_id(request_id),
            override=override,
            role=role,
            fallback_from=None if fallback_from is None else self.model(fallback_from).key,
            immediate_after=after,
        )
        return self.store.reserve(self.policy, request, self.fingerprint)

    def settle(
        self, reservation_id: int, outcome: Outcome, *, overran: bool = False
    ) -> SettleResult:
        """Record the outcome of a reservation and apply the error policy table (SPEC section 8).

        `overran=True` says the call outlived its deadline by the caller's own measure (elapsed
        time since the reservation): the attempt is then `late` whatever the ledger clock says.
        """
        if isinstance(reservation_id, bool) or reservation_id <= 0:
            raise NotFoundError("unknown reservation")
        return self.store.settle(self.catalog, reservation_id, outcome, overran=overran)

    def evolve(self, source: str, model: str, *, input_bytes: int | None = None) -> Reservation:
        """One explicit override attempt (R-RES-9): never skips the hourly/cost ceilings."""
        return self.reserve(source, model, input_bytes=input_bytes, override=True)

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
    ) -> Selection:
        """Ordered eligible routes and every exclusion with its reason (SPEC section 9)."""
        from ledger.select import SelectionRequest, Snapshot, select
        from ledger.store.views import select_state
        from ledger.tokens import estimate_tokens, tokens_for_bytes

        if source is not None:
            check_source_id(source)
        if model is not None:
            self.model(model)
        if failed_model is not None:
            self.model(failed_model)
        size = request_size(input_bytes, text)
        tokens = estimate_tokens(text) if text is not None else tokens_for_bytes(size)
        st = select_state(
            self.db, source, self.policy.calls_per_hour, ceiling_micro(self.policy)
        )
        snapshot = Snapshot(
            now_ms=st.now_ms,
            available_providers=self.catalog.available_providers(self.env),
            cooldowns=st.cooldowns,
            source_models=st.source_models,
            hourly_next_free_ms=st.hourly_next_free_ms,
            daily=st.daily,
        )
        request = SelectionRequest(
            default_model=model or self.policy.default_model,
            input_tokens=tokens,
            after_failure=after_failure,
            failed_model=failed_model,
            tried=tried,
            input_bytes=size,
        )
        return select(self.catalog, self.policy, snapshot, request)

    def add_source(self, source: str, payload_ref: str | None = None, enqueue: bool = True) -> bool:
        """Create or enqueue a source for workers (R-Q-1)."""
        if payload_ref is not None and (len(payload_ref) > 1000 or not payload_ref.isprintable()):
            raise UsageError("a payload reference must be at most 1000 printable characters")
        return self.store.add_source(check_source_id(source), payload_ref, enqueue)

    def set_source_state(self, source: str, action: str) -> str:
        """pause / resume / done."""
        return self.store.set_source_state(check_source_id(source), action)

    def cooldown_target(self, target: str) -> tuple[CooldownScope, str]:
        """A provider name or a catalog model key (unknown ones are bad input)."""
        if "/" in target:
            self.model(target)
            return CooldownScope.MODEL, target
        if target not in self.catalog.providers:
            raise UsageError("unknown provider: not in the catalog")
        return CooldownScope.PROVIDER, target

    # ----------------------------------------------------------------- the work queue (R-Q-1..3)

    @property
    def clock_fn(self) -> Callable[[], int]:
        """This process's view of ledger time (UTC ms), for timing calls against deadlines."""
        return self.db.clock_fn

    def claim(
        self, worker_id: str, *, checked_before: int | None = None
    ) -> store_queue.Claim | None:
        """Lease the due source checked longest ago to `worker_id` for leaseMs (R-Q-2)."""
        return store_queue.claim(
            self.db, worker_id, self.policy.lease_ms, checked_before=checked_before
        )

    def renew(
        self, source: str, worker_id: str, *, cover_until_ms: int = 0, unpaused: bool = False
    ) -> bool:
        """Extend a lease this worker still holds (False: lost, or paused with `unpaused`)."""
        return store_queue.renew(
            self.db, source, worker_id, self.policy.lease_ms,
            cover_until_ms=cover_until_ms, unpaused=unpaused,
        )

    def finish(self, source: str, worker_id: str) -> bool:
        """Mark a leased source done (never rerun); False when the lease was lost."""
        return store_queue.finish(self.db, source, worker_id)

    def release(self, source: str, worker_id: str) -> bool:
        """Give a lease back (the source is queued again behind other work)."""
        return store_queue.release(self.db, source, worker_id)

    def defer_owed_fallback(self, source: str, worker_id: str) -> int | None:
        """No alternate for an owed fallback: the generic backoff; the new retry time."""
        return store_queue.defer_owed_fallback(self.db, source, worker_id, self.store.jitter)

    def queue_times(self) -> store_queue.QueueTimes:
        """Ledger time now and when queued work next becomes due."""
        return store_queue.queue_times(self.db)

    def ledger_now(self) -> int:
        """The ledger's current time (never before the newest stored time)."""
        return store_queue.ledger_now(self.db)

    def compact(self, batch: int) -> int:
        """One bounded compaction step (R-DB-6); rows folded (0 when the lock is busy)."""
        from ledger.budgets import DAY_MS
        from ledger.errors import BusyError
        from ledger.store.compact import compact_step

        try:
            return compact_step(
                self.db, self.db.clock_fn(), self.policy.retention_days * DAY_MS, batch=batch
            )
        except BusyError:
            return 0

    def close(self) -> None:
        """Release database connections."""
        self.db.dispose()
