"""The gateway's request loop (R-GW-2, R-GW-4): select -> reserve -> call -> classify -> settle ->
retry or fall back -> answer, every attempt its own reservation.

The attempt protocol (the plan, the usage -> outcome mapping, the follow-up, the record and its
one settle) is `ledger.attempt`, shared with the worker; this driver keeps the interactive pace
(R-GW-4) and its transport (the group committer, an upstream exchange).

Invariant: every reservation made here is settled exactly once, here or by the stream that took
it over (stream.py); the next attempt is only ever the follow-up the settle result permitted
(`routing.follow_up`, the worker's own decision), at most `gateway.maxAttemptsPerRequest`
attempts; at the queue's pace (`X-Ledger-Pace: background`) the store's R-POL-4 bound applies.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from ledger import attempt as protocol
from ledger.api import Ledger
from ledger.attempt import AttemptPlan, cancelled, failed, reported, settle_async, success
from ledger.classify import Classification
from ledger.gateway import routing
from ledger.gateway.errors import GatewayError
from ledger.gateway.metrics import GatewayMetrics
from ledger.gateway.upstream import UNFIT_ALLOWANCE, Prepared, Reply, prepare
from ledger.gateway.wire import UNFIT
from ledger.kinds import AttemptRole, AttemptStatus, FailureKind
from ledger.policy_table import InteractivePace
from ledger.records import Outcome, SettleResult
from ledger.store.group_commit import GroupCommit
from ledger.telemetry import max_tokens, replied, watch

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


Attempt = protocol.Attempt[Prepared]
"""One attempt in flight (the protocol's record): its reservation, route and prepared request."""


@dataclass
class Answered:
    """The request's answer: a document (non-streaming) or an opened stream (stream.py)."""

    attempt: Attempt
    document: dict[str, Any] | None = None
    stream: Any = None


Exchange = Callable[[Context, Attempt], Awaitable[Reply | Any]]
"""Make the upstream call of one attempt: a Reply (a document or a classified failure), or an
opened stream (anything else), which then owns the settle of its reservation."""


def sender(
    ctx: Context, pace: InteractivePace | None
) -> Callable[[int, Outcome], Awaitable[SettleResult]]:
    """The gateway's settle transport: the group committer, at `pace` (None: the queue's)."""

    def send(reservation_id: int, outcome: Outcome) -> Awaitable[SettleResult]:
        return routing.settle(ctx.ledger, ctx.group, reservation_id, outcome, pace)

    return send


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
    plan = AttemptPlan.primary(route)
    tried: frozenset[str] = frozenset()
    retried: set[str] = set()
    limit = ledger.policy.gateway.max_attempts_per_request
    last: tuple[Classification, Attempt] | None = None
    for number in range(1, limit + 1):
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
            plan = AttemptPlan.primary(route)
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
        prepared = prepare(ledger, model, request.fmt, body, reservation.effort, request.betas)
        attempt = Attempt(number, route, reservation, first, prepared)
        watch(attempt, model.provider, model.id, max_tokens(prepared.body))  # R-OTEL-1
        started = time.monotonic()
        try:
            reply = await exchange(ctx, attempt)
        except BaseException:
            # the caller left (R-GW-7): the slot still counts, at the estimate (no usage seen)
            with anyio.CancelScope(shield=True):
                await settle_async(attempt, cancelled(estimated=True), sender(ctx, None))
            raise
        if not isinstance(reply, Reply):  # counted by the stream once its first bytes are out
            return Answered(attempt, stream=reply)
        count_attempt(ctx, attempt, reply.failure, time.monotonic() - started)
        if reply.failure is None:
            return await _success(ctx, attempt, reply)
        is_retry = plan.role is AttemptRole.RETRY
        pace = pace_for(ledger, background, number, is_retry or route in retried)
        if is_retry:
            retried.add(route)
        outcome = failed(reply.failure, limits=reply.limits)
        settled = await settle_async(attempt, outcome, sender(ctx, pace))
        last = (reply.failure, attempt)
        tried |= {route}
        if number == limit:
            break
        try:
            follow_up = await routing.follow_up(ledger, request, settled, tried)
        except GatewayError:
            follow_up = None
        if follow_up is None:
            break
        plan = follow_up
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
    # an answer without usage is settled at its estimate, marked as a stream's is
    estimated = not reported(facts, facts.cost_usd)
    outcome = success(facts, cost_usd=facts.cost_usd, estimated=estimated, limits=reply.limits)
    replied(attempt, reply.document)  # R-OTEL-1: gen_ai.response.model
    settled = await settle_async(attempt, outcome, sender(ctx, None))
    if settled.must_not_commit:
        raise GatewayError(504, "late", LATE)
    return Answered(attempt, reply.document)


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
