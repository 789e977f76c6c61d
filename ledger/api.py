"""The library API: open a ledger, reserve, settle, select; thin glue over store and pure core."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledger.arguments import (
    check_enum,
    check_flag,
    check_int,
    check_keys,
    check_open,
    check_optional_enum,
    check_payload_ref,
    check_request_id,
    check_reservation_id,
    check_source_action,
    check_source_id,
    check_str,
    request_size,
)
from ledger.budgets.checks import DAY_MS, ceiling_micro, largest_estimate
from ledger.budgets.scopes import check_names as check_scope_names
from ledger.budgets.unit import Budget
from ledger.catalog import Catalog, Model, load_catalog
from ledger.config import POLICY_FILE, Policy, load_policy
from ledger.errors import BusyError, NotFoundError, UsageError
from ledger.home import StateDir, check_db_target, ensure_home, state_dir
from ledger.inert import check_routing
from ledger.kinds import AttemptRole, CooldownScope, FailureKind
from ledger.policy_table import InteractivePace
from ledger.records import (
    Cancelled,
    Failed,
    Outcome,
    Reservation,
    SettleResult,
    SourceStateChange,
    Success,
)
from ledger.routing.chains import pool_members
from ledger.routing.pools import cache_ttl_ms
from ledger.routing.rules import route_allowed
from ledger.routing.select import SelectionRequest, Snapshot, select
from ledger.store import Database, Store
from ledger.store import queue as store_queue
from ledger.store.batch import Answered, Step
from ledger.store.compact import compact_step
from ledger.store.pending import open_database
from ledger.store.reservations import PoolPlan, ReserveRequest
from ledger.store.token_views import TokenWindowUse, read_token_uses
from ledger.store.views import select_state
from ledger.targets import Target, parse_target
from ledger.tokens import estimate_tokens, tokens_for_bytes
from ledger.validation import Slot

if TYPE_CHECKING:
    from ledger.routing.select import Selection

_POOL_PLAN_MEMBERS: Slot[str, tuple[Catalog, tuple[tuple[Model, int | None, int], ...]]] = Slot(
    "pool members a plan may use"
)

def _after_id(after: object) -> int:
    """The failed reservation `after=` names; one beyond any id names none (bad input)."""
    number = check_reservation_id(after, "after")
    if number is None:
        raise UsageError("after names no reservation of this source")
    return number


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
        lazy: bool = False,
        extra_budgets: Sequence[Budget] = (),
    ) -> Ledger:
        """Resolve the state dir, read policy and catalog once (R-HOME-3), check the schema.

        Policy and catalog are validated first, so a bad `recovery.json` is reported before
        anything is created. A missing database is created at once (state directory 0700,
        database 0600, head revision); with `lazy=True` (the CLI) only by the first write that
        records something, the ledger reading as empty until then; with `create=False`
        (read-only commands) never: the ledger reads as empty. `extra_budgets`
        (ledger.budgets.unit) are checked by every reserve besides the policy's, each at its
        stage of the order.
        """
        check_open(home, db, policy, catalog, env, clock, jitter, create)
        state = state_dir(None if home is None else str(home), db)
        policy = policy if policy is not None else load_policy(state.path)
        catalog = catalog if catalog is not None else load_catalog(state.path)
        check_routing(policy, catalog, str(state.path / POLICY_FILE))  # R-RT-3
        check_db_target(state.db_url, home=state.path.absolute())
        database = open_database(
            state.db_url,
            create=create,
            lazy=lazy,
            busy_timeout_ms=policy.busy_timeout_ms,
            clock_fn=clock,
            prepare=partial(ensure_home, state.path),
        )
        return cls(
            state,
            policy,
            catalog,
            Store(database, jitter, extra_budgets),
            os.environ if env is None else env,
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
        return self.catalog.require_model(check_str(key, "a model key"))

    def target(self, key: str) -> Target:
        """A model key, `provider/model:LEVEL` or `pool/NAME` as a Target (R-RT-2, R-RT-4);
        an unknown model or pool is a usage error (never echoed)."""
        target = parse_target(check_str(key, "a model key"))
        if target.is_pool:
            if target.pool_name not in self.policy.pools:
                raise UsageError("unknown pool: not in the policy's `pools`")
        else:
            self.model(target.key)
        return target

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
        scopes: Iterable[str] = (),
    ) -> Reservation:
        """Permission for one call, or `Refused` with its reason code (SPEC section 7).

        `after` names the failed reservation an immediate fallback or correction follows. Only
        the one follow-up that failure's decision permitted is honoured (a fallback to another
        model, a correction on the same one), only while it is the source's newest reservation,
        and never after a follow-up; the ledger then records the role itself and the backoff that
        failure set does not block it (every other check still applies). `role` and
        `fallback_from` are checked against the ledger, never trusted; the privacy boundary
        (route rules, crossProviderFallback, fallbackModels) applies to every reserve.
        `scopes` puts it under scopes of recovery.json besides its source's own (R-SC-1): each
        scope's limits are checked in the same transaction (an unknown name is a usage error).
        """
        request = self._reserve_request(
            source, model, input_bytes, text, request_id, override, role, fallback_from, after,
            scopes,
        )
        return self.store.reserve(self.policy, request, self.fingerprint)

    def reserve_step(
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
        scopes: Iterable[str] = (),
        gateway_key: str | None = None,
    ) -> Step[Reservation]:
        """`reserve`, its arguments checked now, as a step for `write_steps` (group commit).

        `gateway_key`: the name of the gateway key that sent the request (R-SC-3a), its scopes
        given as `scopes`: its request ids are its own, and its source must be new (then made
        under its scopes) or under its scopes only, else SourceScopeMismatch."""
        request = self._reserve_request(
            source, model, input_bytes, text, request_id, override, role, fallback_from, after,
            scopes,
        )
        if gateway_key is not None:
            name = check_str(gateway_key, "gateway_key")
            request = replace(request, gateway_key=name)
        return self.store.reserve_step(self.policy, request, self.fingerprint)

    def _reserve_request(
        self,
        source: str,
        model: str,
        input_bytes: int | None,
        text: str | None,
        request_id: str | None,
        override: bool,
        role: AttemptRole,
        fallback_from: str | None,
        after: int | None,
        scopes: Iterable[str] = (),
    ) -> ReserveRequest:
        """The checked request of a reserve (bad input raises before any transaction).

        `model` may be `provider/model:LEVEL`, a `Route` from `select` (its effort is kept) or
        `pool/NAME` (the reserve then picks the concrete candidate, R-RT-5).
        """
        target = self.target(model)
        effort = target.effort or getattr(model, "effort", None)
        size = request_size(input_bytes, text)
        plan = None
        if target.is_pool:
            plan = self._pool_plan(target.key, size, text, effort)
            first = next(iter(plan.models.values()), None)
            chosen = first if first is not None else self._any_member(target.key)
        else:
            chosen = self.model(target.key)
        return ReserveRequest(
            source_id=check_source_id(source),
            model=chosen,
            input_bytes=size,
            request_id=check_request_id(request_id),
            override=check_flag(override, "override"),
            role=check_enum(AttemptRole, role, "role"),
            fallback_from=None if fallback_from is None else self.model(fallback_from).key,
            immediate_after=None if after is None else _after_id(after),
            effort=None if effort is None else str(effort),
            pool=plan,
            scopes=check_scope_names(scopes, self.policy),
        )

    def _any_member(self, key: str) -> Model:
        """Some catalog model of a pool (the request's placeholder when none can be called)."""
        for member in pool_members(self.policy, key):
            found = self.catalog.model(member.key)
            if found is not None:
                return found
        raise UsageError("this pool has no candidate in the catalog")

    def _pool_plan(
        self, key: str, size: int, text: str | None, effort: object
    ) -> PoolPlan:
        """The pool's candidates that can be called at all for this request: available, with a
        base URL and text, allowed by the route rules, fitting the request (R-SEL-1, 8, 9)."""

        available = self.catalog.available_providers(self.env)  # read each time: env may change
        tokens = estimate_tokens(text) if text is not None else tokens_for_bytes(size)
        members = self._pool_members(key)
        models = {
            m.key: m
            for m, limit, _ in members
            if m.provider in available and (limit is None or tokens <= limit)
        }
        return PoolPlan(
            pool=key.removeprefix("pool/"),
            models=models,
            effort=None if effort is None else str(effort),
            cache_ttl_ms={m.key: ttl for m, _, ttl in members if m.key in models},
        )

    def callable_alone(self, key: str, input_bytes: int) -> bool:
        """Whether catalog and policy alone let the model `key` (a catalog model key, not a
        pool) serve a fresh request of `input_bytes`: its provider available, with a base URL
        and text, allowed by the route rules, the request fitting its context and, under a cost
        ceiling, its price known (the R-SEL-1/8/9/10 checks no ledger state decides). Every
        other reason selection could exclude it for (cooldowns, probes, the source's models) is
        checked again by its reserve, in the write transaction, as a refusal."""
        size = request_size(input_bytes, None)
        key = self.model(key).key  # an unknown model is a usage error (never echoed)
        model = self._pool_plan(key, size, None, None).models.get(key)  # a key is its own pool
        if model is None:
            return False
        return self.policy.daily_estimated_usd is None or model.price_known()

    def _pool_members(self, key: str) -> tuple[tuple[Model, int | None, int], ...]:
        """A pool's members that policy and catalog alone allow (in the catalog, with a base URL
        and text, allowed by the route rules), each with its input-token limit and prompt-cache
        TTL; worked out once per policy and catalog (both immutable), availability left out."""
        return self.policy.derived.value(
            _POOL_PLAN_MEMBERS,
            key,
            lambda: (self.catalog, self._make_pool_members(key)),
            lambda found: found[0] is self.catalog,
        )[1]

    def _make_pool_members(self, key: str) -> tuple[tuple[Model, int | None, int], ...]:
        no_url = self.catalog.providers_without_base_url()
        out = []
        for member in pool_members(self.policy, key):
            model = self.catalog.model(member.key)
            if (
                model is None
                or model.provider in no_url
                or not model.text_capable
                or not route_allowed(model.key, self.policy.routes)
            ):
                continue
            limit = None
            if model.context_window is not None:
                limit = model.context_window - model.reply_reservation(self.policy.reply_tokens)
            out.append((model, limit, cache_ttl_ms(self.catalog, model.key)))
        return tuple(out)

    def settle(
        self, reservation_id: int, outcome: Outcome, *, overran: bool = False
    ) -> SettleResult:
        """Record the outcome of a reservation and apply the error policy table (SPEC section 8).

        `overran=True` says the call outlived its deadline by the caller's own measure (elapsed
        time since the reservation): the attempt is then `late` whatever the ledger clock says.
        """
        _check_settle(reservation_id, outcome, overran)
        return self.store.settle(self.catalog, reservation_id, outcome, overran=overran)

    def settle_step(
        self,
        reservation_id: int,
        outcome: Outcome,
        *,
        overran: bool = False,
        pace: InteractivePace | None = None,
    ) -> Step[SettleResult]:
        """`settle`, its arguments checked now, as a step for `write_steps` (group commit).

        `pace`: the attempt belongs to a gateway request at interactive pace (R-GW-4): its
        failure may permit one same-model retry and, within the request's attempts, follow-ups
        of follow-ups; cooldowns, strikes and probes are recorded as at the queue's pace."""
        _check_settle(reservation_id, outcome, overran)
        if pace is not None and not isinstance(pace, InteractivePace):
            raise UsageError("pace must be an InteractivePace")
        return self.store.settle_step(
            self.catalog, reservation_id, outcome, overran=overran, pace=pace
        )

    def write_steps(self, steps: Sequence[Step[Any]]) -> list[Answered[Any]]:
        """Steps from `reserve_step`/`settle_step`, in this order, in one write transaction,
        each checked as if it ran alone; every answer only after the commit (R-SRV-3)."""
        if not isinstance(steps, list | tuple) or not all(isinstance(s, Step) for s in steps):
            raise UsageError("steps must be a list of steps from reserve_step or settle_step")
        if not steps:
            return []
        return self.store.write_steps(steps)

    def evolve(self, source: str, model: str, *, input_bytes: int | None = None) -> Reservation:
        """One explicit override attempt (R-RES-9) on a known source (`NotFoundError` for an
        unknown one, in the same transaction: a mistyped id creates nothing and spends no call);
        never skips the hourly/cost ceilings."""
        return self.store.reserve(
            self.policy, self._evolve_request(source, model, input_bytes), self.fingerprint
        )

    def evolve_step(
        self, source: str, model: str, *, input_bytes: int | None = None
    ) -> Step[Reservation]:
        """`evolve`, its arguments checked now, as a step for `write_steps` (group commit)."""
        request = self._evolve_request(source, model, input_bytes)
        return self.store.reserve_step(self.policy, request, self.fingerprint)

    def _evolve_request(self, source: str, model: str, input_bytes: int | None) -> ReserveRequest:
        """The checked override request of `evolve`: on a source that must exist already."""
        request = self._reserve_request(
            source, model, input_bytes, None, None, True, AttemptRole.PRIMARY, None, None
        )
        return replace(request, existing=True)

    def select(
        self,
        source: str | None,
        *,
        model: str | None = None,
        input_bytes: int | None = None,
        text: str | None = None,
        after_failure: FailureKind | None = None,
        failed_model: str | None = None,
        tried: Iterable[str] = frozenset(),
    ) -> Selection:
        """Ordered eligible routes and every exclusion with its reason (SPEC section 9)."""

        if source is not None:
            check_source_id(source)
        if model is not None:
            target: Target | None = self.target(model)
        elif self.policy.default_model is not None:
            # the policy's own default: one the catalog lacks is reported inert, never refused
            target = parse_target(self.policy.default_model)
        else:
            target = None
        if failed_model is not None:
            self.model(failed_model)
        after_failure = check_optional_enum(FailureKind, after_failure, "after_failure")
        tried = check_keys(tried, "tried")
        size = request_size(input_bytes, text)
        tokens = estimate_tokens(text) if text is not None else tokens_for_bytes(size)
        ceiling = ceiling_micro(self.policy)
        # the window's rows are read only when some model's estimate would not fit (R-SEL-10)
        need = (
            None
            if ceiling is None
            else largest_estimate(self.catalog.models, size, self.policy.reply_tokens, ceiling)
        )
        st = select_state(self.db, source, self.policy.calls_per_hour, ceiling, need,
                          self.policy, tokens_for_bytes(size))  # fmt: skip
        snapshot = Snapshot(
            now_ms=st.now_ms,
            available_providers=self.catalog.available_providers(self.env),
            cooldowns=st.cooldowns,
            source_models=st.source_models,
            hourly_next_free_ms=st.hourly_next_free_ms,
            daily=st.daily,
            probing=st.probing,
            tokens=st.tokens,
        )
        request = SelectionRequest(
            default_model=None if target is None else target.key,
            default_effort=None if target is None else target.effort,
            input_tokens=tokens,
            after_failure=after_failure,
            failed_model=failed_model,
            tried=tried,
            input_bytes=size,
        )
        return select(self.catalog, self.policy, snapshot, request)

    def add_source(
        self,
        source: str,
        payload_ref: str | None = None,
        enqueue: bool = True,
        *,
        scopes: Iterable[str] = (),
    ) -> bool:
        """Create or enqueue a source for workers (R-Q-1); `scopes` puts it (and so every
        reservation of it) under those scopes too, besides any it is under already (R-SC-1)."""
        source = check_source_id(source)
        payload_ref = check_payload_ref(payload_ref)
        names = check_scope_names(scopes, self.policy)
        return self.store.add_source(source, payload_ref, check_flag(enqueue, "enqueue"), names)

    def set_source_state(self, source: str, action: str) -> SourceStateChange:
        """pause / resume / done; a pause of a paused source keeps its reason (`already`)."""
        return self.store.set_source_state(check_source_id(source), check_source_action(action))

    def cooldown_target(self, target: str) -> tuple[CooldownScope, str]:
        """A provider name or a catalog model key (unknown ones are bad input)."""
        if "/" in check_str(target, "a cooldown target"):
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
        self,
        worker_id: str,
        *,
        checked_before: int | None = None,
        skip_scopes: Iterable[str] = (),
    ) -> store_queue.Claim | None:
        """Lease the due source checked longest ago to `worker_id` for leaseMs (R-Q-2); with
        `checked_before`, none added under any of `skip_scopes`."""
        check_str(worker_id, "worker_id")
        if checked_before is not None:
            check_int(checked_before, "checked_before")
        skip = frozenset(check_scope_names(skip_scopes, self.policy))
        return store_queue.claim(
            self.db, worker_id, self.policy.lease_ms, checked_before=checked_before,
            skip_scopes=skip,
        )  # fmt: skip

    def token_windows(self) -> list[TokenWindowUse]:
        """Every token window the policy sets, with its use now (R-TOK-5's status rows)."""
        return read_token_uses(self.db, self.policy)

    def renew(
        self, source: str, worker_id: str, *, cover_until_ms: int = 0, unpaused: bool = False
    ) -> bool:
        """Extend a lease this worker still holds (False: lost, or paused with `unpaused`)."""
        _check_lease(source, worker_id)
        check_int(cover_until_ms, "cover_until_ms")
        check_flag(unpaused, "unpaused")
        return store_queue.renew(
            self.db, source, worker_id, self.policy.lease_ms,
            cover_until_ms=cover_until_ms, unpaused=unpaused,
        )

    def finish(self, source: str, worker_id: str) -> bool:
        """Mark a leased source done (never rerun); False when the lease was lost."""
        _check_lease(source, worker_id)
        return store_queue.finish(self.db, source, worker_id)

    def release(self, source: str, worker_id: str) -> bool:
        """Give a lease back (the source is queued again behind other work)."""
        _check_lease(source, worker_id)
        return store_queue.release(self.db, source, worker_id)

    def release_spent(self, source: str, worker_id: str) -> str | None:
        """Give a lease back after a `source_calls` / `source_time` refusal: a source that has used
        that cap is paused with it as the reason (returned) instead of queued again; otherwise
        (not spent after all, or the lease was lost) as `release`, returning None."""
        _check_lease(source, worker_id)
        return store_queue.release_spent(self.db, source, worker_id, self.policy)

    def defer_owed_fallback(self, source: str, worker_id: str) -> int | None:
        """No alternate for an owed fallback: the generic backoff; the new retry time."""
        _check_lease(source, worker_id)
        return store_queue.defer_owed_fallback(self.db, source, worker_id, self.store.jitter)

    def commit_failed(
        self, source: str, worker_id: str, model: str
    ) -> store_queue.CommitFailure | None:
        """The handler's commit raised: one failure of the source with its backoff (issue 20
        item 1); None when the lease was lost meanwhile."""
        _check_lease(source, worker_id)
        check_str(model, "model")
        return store_queue.commit_failed(self.db, source, worker_id, model, self.store.jitter)

    def queue_times(self) -> store_queue.QueueTimes:
        """Ledger time now and when queued work next becomes due."""
        return store_queue.queue_times(self.db)

    def ledger_now(self) -> int:
        """The ledger's current time (never before the newest stored time)."""
        return store_queue.ledger_now(self.db)

    def compact(self, batch: int) -> int:
        """One bounded compaction step (R-DB-6); rows folded (0 when the lock is busy)."""
        check_int(batch, "batch")

        try:
            return compact_step(
                self.db, self.db.clock_fn(), self.policy.retention_days * DAY_MS, batch=batch
            )
        except BusyError:
            return 0

    def close(self) -> None:
        """Release database connections."""
        self.db.dispose()


def _check_settle(reservation_id: object, outcome: object, overran: object) -> None:
    """The arguments of a settle."""
    if check_reservation_id(reservation_id, "a reservation id") is None:
        raise NotFoundError("unknown reservation")
    if not isinstance(outcome, Success | Failed | Cancelled):
        raise UsageError("an outcome must be a Success(...), Failed(...) or Cancelled()")
    check_flag(overran, "overran")


def _check_lease(source: object, worker_id: object) -> None:
    """The arguments of every lease operation: a source id and a worker id (both text)."""
    check_source_id(source)
    check_str(worker_id, "worker_id")
