"""The gateway's request loop (R-GW-2, R-GW-4): select -> reserve -> call -> classify -> settle ->
retry or fall back -> answer, every attempt its own reservation.

Invariant: every reservation made here is settled exactly once, here or by the stream that took
it over (stream.py); the next attempt is only ever the follow-up the settle result permitted
(`routing.follow_up`, the worker's own decision), at most `gateway.maxAttemptsPerRequest`
attempts; at the queue's pace (`X-Ledger-Pace: background`) the store's R-POL-4 bound applies.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from ledger.api import Ledger
from ledger.classify import Classification
from ledger.follow_up import FollowUpPlan
from ledger.gateway import routing
from ledger.gateway.errors import GatewayError
from ledger.gateway.metrics import GatewayMetrics
from ledger.gateway.upstream import UNFIT_ALLOWANCE, Prepared, Reply, prepare
from ledger.gateway.wire import UNFIT
from ledger.kinds import AttemptRole, AttemptStatus, FailureKind
from ledger.policy_table import InteractivePace
from ledger.records import Cancelled, Failed, Reservation, SettleResult, Success
from ledger.store.group_commit import GroupCommit

REUSED = "this Idempotency-Key belongs to a request that was already answered"
IN_FLIGHT = "a request with this Idempotency-Key is still being answered"
LATE = "the upstream answer came after the reservation's deadline and is not used (R-RES-11)"


@dataclass(frozen=True)
class Context:
    """The service's parts a gateway request uses."""

    ledger: Ledger
    group: GroupCommit
    upstream: httpx.AsyncBaseTransport  # the pooled upstream connections (upstream.transport)
    metrics: GatewayMetrics | None = None
    template: str = ""  # the route template, the metrics' `route` label


@dataclass
class Attempt:
    """One attempt in flight: its reservation, route and how it was planned."""

    number: int
    route: str
    reservation: Reservation
    prepared: Prepared
    first_route: str

    @property
    def fallback_from(self) -> str | None:
        """The model the request asked for, when another answered (R-GW-6)."""
        return self.first_route if self.route != self.first_route else None

    def headers(self) -> dict[str, str]:
        """R-GW-6: which model answered, after how many attempts, under which reservation."""
        out = {
            "x-ledger-model": self.route,
            "x-ledger-attempts": str(self.number),
            "x-ledger-reservation": str(self.reservation.id),
        }
        if self.fallback_from is not None:
            out["x-ledger-fallback-from"] = self.fallback_from
        return out


@dataclass
class Answered:
    """The request's answer: a document (non-streaming) or an opened stream (stream.py)."""

    attempt: Attempt
    document: dict[str, Any] | None = None
    stream: Any = None
    settled: SettleResult | None = field(default=None, repr=False)


Exchange = Callable[[Context, Attempt], Awaitable[Reply | Any]]
"""Make the upstream call of one attempt: a Reply (a document or a classified failure), or an
opened stream (anything else), which then owns the settle of its reservation."""


def pace_for(
    ledger: Ledger, background: bool, attempt: int, retried: bool
) -> InteractivePace | None:
    """R-GW-4: the interactive pace of this attempt (None: the queue's pace)."""
    if background:
        return None
    gw = ledger.policy.gateway
    return InteractivePace(
        max_retry_wait_ms=gw.max_retry_wait_ms,
        retry_backoff_ms=gw.retry_backoff_ms,
        attempts_left=gw.max_attempts_per_request - attempt,
        retried=retried,
    )


async def run(
    ctx: Context,
    request: routing.Request,
    body: dict[str, Any],
    exchange: Exchange,
    *,
    background: bool = False,
) -> Answered:
    """Serve one request: attempts until one answers or none is permitted (then its error)."""
    ledger = ctx.ledger
    named = routing.named_route(ledger, request)  # no selection when only the ledger decides
    route = named if named is not None else await routing.first_route(ledger, request)
    first = request.model  # another model answering (cooling primary, fallback) names it
    plan: FollowUpPlan | None = None
    tried: frozenset[str] = frozenset()
    retried: set[str] = set()
    limit = ledger.policy.gateway.max_attempts_per_request
    last: tuple[Classification, Attempt] | None = None
    for number in range(1, limit + 1):
        if plan is not None:
            route = plan.route
            if plan.wait_ms:
                await anyio.sleep(plan.wait_ms / 1000)
        try:
            reservation = await routing.reserve(ledger, ctx.group, request, route, number, plan)
        except GatewayError as refusal:
            if named is None or number > 1:
                raise
            named = None  # the named model refused: the selection says which route, if any
            route = await routing.after_refusal(ledger, request, route, refusal)
            reservation = await routing.reserve(ledger, ctx.group, request, route, number, plan)
        if reservation.replayed:  # never a second upstream call on one slot
            if reservation.status is AttemptStatus.OPEN:  # another request holds it, or a
                # service killed mid-call left it open: it frees (expires) at its deadline
                wait = routing.retry_after_s(reservation.deadline_ms, ledger.clock_fn())
                raise GatewayError(409, "idempotency_key_in_flight", IN_FLIGHT, wait)
            raise GatewayError(409, "idempotency_key_reused", REUSED)
        if reservation.pool is not None:  # R-RT-5: the pool's concrete pick is what is called
            route = reservation.model
            if number == 1:
                first = route
        model = ledger.model(reservation.model)
        prepared = prepare(ledger, model, request.fmt, body, reservation.effort)
        attempt = Attempt(number, route, reservation, prepared, first)
        started = time.monotonic()
        try:
            reply = await exchange(ctx, attempt)
        except BaseException:
            # the caller left (R-GW-7): the slot still counts, at the estimate (no usage seen)
            with anyio.CancelScope(shield=True):
                left = Cancelled(usage_estimated=True)
                await routing.settle(ledger, ctx.group, reservation.id, left, None)
            raise
        if not isinstance(reply, Reply):  # counted by the stream once its first bytes are out
            return Answered(attempt, stream=reply)
        count_attempt(ctx, attempt, reply.failure, time.monotonic() - started)
        if reply.failure is None:
            return await _success(ctx, attempt, reply)
        is_retry = plan is not None and plan.role is AttemptRole.RETRY
        pace = pace_for(ledger, background, number, is_retry or route in retried)
        if is_retry:
            retried.add(route)
        settled = await routing.settle(
            ledger, ctx.group, reservation.id, Failed(reply.failure), pace
        )
        last = (reply.failure, attempt)
        tried |= {route}
        if number == limit:
            break
        try:
            plan = await routing.follow_up(ledger, request, settled, tried)
        except GatewayError:
            plan = None
        if plan is None:
            break
    assert last is not None
    raise failure_error(last[0], last[1].number, ledger.clock_fn())


def count_attempt(
    ctx: Context, attempt: Attempt, failure: Classification | None, seconds: float
) -> None:
    """The attempt in the gateway's metrics: its result and upstream time, and a fallback that
    answered."""
    if ctx.metrics is None:
        return
    result = "ok" if failure is None else str(failure.kind)
    ctx.metrics.attempt(ctx.template, attempt.route, result, seconds)
    if failure is None and attempt.fallback_from is not None:
        ctx.metrics.fallbacks.labels(ctx.template).inc()


async def _success(ctx: Context, attempt: Attempt, reply: Reply) -> Answered:
    facts = reply.facts
    assert facts is not None
    assert reply.document is not None
    settled = await routing.settle(
        ctx.ledger,
        ctx.group,
        attempt.reservation.id,
        Success(
            facts.input_tokens,
            facts.output_tokens,
            facts.cost_usd,
            cache_write_tokens=facts.cache_write_tokens,
            cache_read_tokens=facts.cache_read_tokens,
            # an answer without usage is settled at its estimate, marked as a stream's is
            usage_estimated=facts.input_tokens is None and facts.output_tokens is None
            and facts.cost_usd is None,
        ),
        None,
    )
    if settled.must_not_commit:
        raise GatewayError(504, "late", LATE)
    return Answered(attempt, reply.document, settled=settled)


FAILURES: dict[FailureKind, tuple[int, str, str]] = {
    FailureKind.RATE_LIMIT: (429, "rate_limit", "the upstream provider is rate-limiting"),
    FailureKind.TRANSPORT: (502, "upstream_unavailable", "the upstream provider did not answer"),
    FailureKind.REQUEST_REJECTED: (400, "request_rejected", "the upstream provider rejected it"),
    FailureKind.SAFETY: (400, "safety", "the upstream provider refused it for safety"),
    FailureKind.AUTH: (502, "upstream_auth", "the upstream provider refused our credentials"),
    FailureKind.QUOTA: (502, "upstream_quota", "the upstream account is out of quota"),
}


def failure_error(failure: Classification, attempts: int, now_ms: int) -> GatewayError:
    """The answer after the last permitted attempt failed (never the upstream's body)."""
    status, code, text = FAILURES.get(
        failure.kind, (502, "upstream_error", "the upstream call failed")
    )
    if failure.kind is FailureKind.REQUEST_REJECTED and "context" in failure.subkind:
        code, text = "context_length_exceeded", "the request does not fit the model's context"
    if failure.subkind == UNFIT_ALLOWANCE.subkind:  # decided here: nothing was sent
        code, text = "invalid_request", UNFIT
    if failure.kind is FailureKind.TRANSPORT and failure.subkind == "timeout":
        status, code = 504, "upstream_timeout"
    wait = failure.retry_after_ms
    retry_after = None if wait is None else max(1, -(-wait // 1000))
    return GatewayError(status, code, f"{text} ({attempts} attempt(s))", retry_after, attempts)
