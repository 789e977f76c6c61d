"""Streaming through the gateway (R-GW-5, R-GW-7): server-sent events in the caller's format.

Until the first content event of an upstream stream has arrived, nothing is sent to the caller:
the preamble is held, and a failure (error status, reset, first-event timeout, malformed event,
a cut) is an ordinary failed attempt of the request loop, retried or failed over transparently.
Once the first content event is ready the answer starts, and from then on a failure (idle
timeout, cut, malformed event) ends the stream with the format's error event: it is settled as
the failure it is and never replayed or continued on another model.

A stream still being relayed when its reservation's deadline comes (a slow upstream or a slow
reader) is ended with the format's error event, code `deadline` (R-GW-5b): its upstream request
is closed and its reservation settled `cancelled` before that deadline, a margin ahead of it
(`stop_ms`), so its in-flight slot is never free in the store while the exchange is still open.

Invariant: the reservation of an opened stream is settled exactly once, by `relay`: success with
the stream's usage (none: the estimate, marked `usage_estimated`), the failure, or `cancelled`
when the caller left or the deadline came (the upstream request is closed first) with the usage
seen so far (R-GW-7, R-GW-5b). Usage includes the prompt-cache tokens (R-GW-5c).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import anyio
import httpx
from fastapi.responses import StreamingResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from ledger.attempt import cancelled, failed, settle_async, success
from ledger.classify import Classification, classify_exception
from ledger.gateway import kept, loop, routing
from ledger.gateway.formats.translate import stream_translator
from ledger.gateway.sse import (
    MAX_HELD_EVENTS,
    Event,
    Malformed,
    Tracker,
    encode,
    events,
    lines_of,
)
from ledger.gateway.upstream import (
    MALFORMED,
    Reply,
    build_request,
    error_classification,
    heard,
    send,
)
from ledger.gateway.wire import answer_headers
from ledger.kinds import FailureKind
from ledger.learned import LearnedLimits
from ledger.providers.bounded import TRANSPORT_ERRORS
from ledger.records import Cancelled, Reservation
from ledger.telemetry import first_chunk

STALLED = Classification(FailureKind.TRANSPORT, "stream_stalled")
CUT = Classification(FailureKind.TRANSPORT, "stream_cut")
FIRST_EVENT = Classification(FailureKind.TRANSPORT, "first_event_timeout")
ENDED = "the upstream stream failed after it began; it is not continued elsewhere"
DEADLINE = "the reservation's deadline came before the stream ended; it is not continued"
DEADLINE_MARGIN_MS = 1000
"""How long before its reservation's deadline a stream's exchange ends (at most a tenth of the
reservation's allowance): room to close the upstream request and settle, so that neither happens
after the deadline (R-GW-5b)."""


@dataclass
class Opened:
    """An upstream stream whose first content event arrived: held events and the rest to read."""

    response: httpx.Response
    held: list[Event]
    tracker: Tracker
    rest: AsyncIterator[Event]
    first_event_s: float  # from the upstream request to its first content event
    limits: LearnedLimits | None = None  # the token limits its head reported (R-TOK-4)


async def serve_stream(
    ctx: loop.Context,
    request: routing.Request,
    body: dict[str, Any],
    background: bool,
    http: Request,
) -> StreamingResponse:
    """Run the request loop with streaming exchanges; the answer relays the opened stream."""
    answered = await loop.run(ctx, request, body, stream_exchange, background=background)
    opened = answered.stream
    assert isinstance(opened, Opened)
    attempt = answered.attempt
    await kept.keep(ctx, attempt, opened.tracker.answer_id)  # R-FMT-2: known from its start
    pace = loop.pace_for(ctx.ledger, background, attempt.number, True)
    deadline = Deadline(
        anyio.current_time() + _deadline_s(ctx, attempt),
        attempt.prepared.caller.stream_error_event(504, "deadline", DEADLINE),
        ctx.ledger.policy.gateway.idle_ms / 1000,
        lambda: _count_failed(ctx),
    )
    response = RelayedResponse(
        relay(ctx, attempt, opened, pace, deadline),
        media_type="text/event-stream",
        headers={**answer_headers(attempt), "cache-control": "no-cache"},
    )
    response.deadline = deadline
    return response


@dataclass
class Deadline:
    """When a relayed stream ends unless it ended before (R-GW-5b): `at` on anyio's clock, the
    error event the caller then gets (within `grace_s`: a caller that does not take it by then
    is cut), and the metric it counts. `scope` is the relay's, while it runs."""

    at: float
    event: bytes
    grace_s: float
    count: Callable[[], None]
    scope: anyio.CancelScope | None = None

    def disarm(self) -> bool:
        """The stream ends now on its own (settled as what it was): no deadline after this.
        False when the deadline came first (its cancellation is then on its way)."""
        if self.scope is None:
            return True
        if self.scope.cancel_called:
            return False
        self.scope.deadline = math.inf
        return True


class RelayedResponse(StreamingResponse):
    """The relayed stream, written in the request's own task. Its head goes out with its first
    chunk, the held events (one write: the caller reads both at once rather than waking for
    each); that chunk waits on nothing upstream, so only then is the caller's disconnect watched,
    by one plain task beside the rest, which cancels the relay (R-GW-7: it closes the upstream
    request and settles `cancelled`). Starlette would start an anyio task group for both before
    the first byte, which cost 0.25 ms here."""

    deadline: Deadline | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = self.body_iterator.__aiter__()
        deadline = self.deadline
        started = False
        # R-GW-5b: the deadline covers the writes to the caller (a slow reader) as well as the
        # reads from upstream; the relay, cancelled, closes upstream and settles `cancelled`
        timed = anyio.CancelScope(deadline=math.inf if deadline is None else deadline.at)
        if deadline is not None:
            deadline.scope = timed
        try:
            with timed:
                first = await anext(chunks, b"")
                await send({"type": "http.response.start", "status": self.status_code,
                            "headers": self.raw_headers})  # fmt: skip
                started = True
                if first:
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                await unless_disconnected(receive, lambda: self.rest(chunks, send))
        finally:
            # the relay settles in its own `finally` (shielded) if it had not: close it here
            # rather than leave it to the garbage collector
            with anyio.CancelScope(shield=True):
                await chunks.aclose()  # type: ignore[attr-defined]
        if timed.cancelled_caught and deadline is not None:
            await self._deadline(deadline, send, started)

    async def _deadline(self, deadline: Deadline, send: Send, started: bool) -> None:
        """The format's error event, code `deadline`, and the body's end (R-GW-5b); the
        reservation is settled already."""
        deadline.count()
        with anyio.move_on_after(deadline.grace_s):
            if not started:
                await send({"type": "http.response.start", "status": self.status_code,
                            "headers": self.raw_headers})  # fmt: skip
            await send({"type": "http.response.body", "body": deadline.event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def rest(self, chunks: AsyncIterator[Any], send: Send) -> None:
        """The chunks after the first, then the end of the body."""
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


T = TypeVar("T")


async def unless_disconnected(receive: Receive, work: Callable[[], Awaitable[T]]) -> T | None:
    """`work`'s result, run in this task, or None when the caller disconnected first: one plain
    task watches `receive` and cancels the work's scope (R-GW-7; an anyio task group would cost
    0.25 ms a request here)."""
    cancel = anyio.CancelScope()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        cancel.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        with cancel:
            return await work()
        return None  # cancelled by the watcher: the caller left
    finally:
        watcher.cancel()


def stop_ms(reservation: Reservation) -> int:
    """When a stream's upstream exchange ends at the latest (ledger time): DEADLINE_MARGIN_MS,
    at most a tenth of the allowance, before the reservation's deadline (R-GW-5b)."""
    allowance = reservation.deadline_ms - reservation.created_ms
    return reservation.deadline_ms - min(DEADLINE_MARGIN_MS, max(0, allowance) // 10)


def _deadline_s(ctx: loop.Context, attempt: loop.Attempt) -> float:
    return max(0.001, (stop_ms(attempt.reservation) - ctx.ledger.clock_fn()) / 1000)


async def stream_exchange(ctx: loop.Context, attempt: loop.Attempt) -> Reply | Opened:
    """Open the upstream stream and read up to its first content event (within firstTokenMs)."""
    gw = ctx.ledger.policy.gateway
    started = time.monotonic()
    budget = min(gw.first_token_ms / 1000, _deadline_s(ctx, attempt))
    response: httpx.Response | None = None
    try:
        async with asyncio.timeout(budget):
            request = build_request(attempt.prepared)
            if isinstance(request, Classification):
                return Reply(None, None, request)
            response = await send(ctx.upstream, request)
            limits = heard(attempt.prepared, response, ctx.ledger.clock_fn())
            if response.status_code >= 300:
                failure = await error_classification(response, ctx.ledger.clock_fn())
                await response.aclose()
                return Reply(None, None, failure, limits=limits)
            tracker = Tracker(attempt.prepared.fmt)
            rest = events(lines_of(response.aiter_bytes()))
            held: list[Event] = []
            async for event in rest:
                tracker.observe(event)
                if tracker.error:
                    await response.aclose()
                    return Reply(None, None, CUT, limits=limits)
                held.append(event)
                if tracker.content or tracker.terminated:
                    seconds = time.monotonic() - started  # counted once the answer began
                    return Opened(response, held, tracker, rest, seconds, limits)
                if len(held) >= MAX_HELD_EVENTS:  # no content yet: a broken stream
                    raise Malformed
            await response.aclose()
            return Reply(None, None, CUT, limits=limits)  # ended before any content: a cut
    except TimeoutError:
        await _close(response)
        return Reply(None, None, FIRST_EVENT)
    except Malformed:
        await _close(response)
        return Reply(None, None, MALFORMED)
    except TRANSPORT_ERRORS as exc:
        await _close(response)
        return Reply(None, None, classify_exception(exc))


async def _close(response: httpx.Response | None) -> None:
    if response is not None:
        with anyio.CancelScope(shield=True):
            await response.aclose()


async def relay(
    ctx: loop.Context,
    attempt: loop.Attempt,
    opened: Opened,
    pace: Any,
    deadline: Deadline | None = None,
) -> AsyncIterator[bytes]:
    """The caller's stream: held events, then the rest; settles the reservation exactly once.
    Its consumer cancels it at the deadline (R-GW-5b): its `finally` then closes the upstream
    request and settles `cancelled`, as when the caller leaves."""
    fmt = attempt.prepared.caller
    shown = attempt.prepared.usage_shown
    translator = stream_translator(fmt, attempt.prepared.fmt, attempt.route, shown)

    def out(event: Event) -> Iterable[bytes]:
        if translator is None:
            if not shown and fmt.usage_only(event.data):
                return ()  # read for the settle; not asked for by the caller
            return (encode(fmt, event, attempt.route),)
        return translator.feed(event)

    tracker = opened.tracker
    idle = ctx.ledger.policy.gateway.idle_ms / 1000
    failure: Classification | None = None
    try:
        yield b"".join(data for event in opened.held for data in out(event))  # one write
        _count_opened(ctx, attempt, opened)  # once the caller has its first bytes
        while not tracker.terminated:
            try:
                async with asyncio.timeout(idle):  # the deadline is the consumer's scope
                    event = await opened.rest.__anext__()
                tracker.observe(event)
            except StopAsyncIteration:
                break
            except TimeoutError:
                failure = STALLED
                break
            except Malformed:
                failure = MALFORMED
                break
            except TRANSPORT_ERRORS as exc:
                failure = classify_exception(exc)
                break
            if tracker.error:
                failure = CUT
                break
            for data in out(event):
                yield data
        if failure is None and tracker.finish is None:
            failure = CUT  # ended without a finish reason: cut (with one: complete, R-GW-5)
        if failure is None and tracker.terminated:
            await _drain(opened)
        await _close(opened.response)
        if deadline is not None and not deadline.disarm():
            await anyio.lowlevel.checkpoint()  # the deadline came first: cancelled here
        if failure is not None:
            await _settle_failure(ctx, attempt, opened, failure, pace)
            _count_failed(ctx)
            yield fmt.stream_error_event(502, "upstream_stream_failed", ENDED)
            return
        await _settle_success(ctx, attempt, opened)
        if translator is not None:
            for data in translator.finish():
                yield data
    finally:
        if attempt.outcome is None:  # the caller left (R-GW-7): close upstream, settle cancelled
            with anyio.CancelScope(shield=True):
                await opened.response.aclose()
                await settle_async(attempt, _cancelled(opened), loop.sender(ctx, None))


def _count_failed(ctx: loop.Context) -> None:
    """A stream that began and then failed or met its deadline, in the metrics."""
    if ctx.metrics is not None:
        ctx.metrics.request(ctx.template, "stream_failed")


def _count_opened(ctx: loop.Context, attempt: loop.Attempt, opened: Opened) -> None:
    """The answered request, its answering attempt and that attempt's time to the first content
    event, in the metrics."""
    seconds = opened.first_event_s
    loop.count_attempt(ctx, attempt, None, seconds)
    first_chunk(attempt, seconds, (event.data for event in opened.held))  # R-OTEL-1
    if ctx.metrics is not None:
        ctx.metrics.first_token.labels(ctx.template).observe(seconds)
        ctx.metrics.request(ctx.template, "answered")


DRAIN_S = 0.25
DRAIN_EVENTS = 8
DRAIN_ENDS: tuple[type[BaseException], ...] = (StopAsyncIteration, Malformed, *TRANSPORT_ERRORS)


async def _drain(opened: Opened) -> None:
    """Read the body's end after the stream's terminator (at most DRAIN_EVENTS events within
    DRAIN_S, all ignored), so the upstream connection goes back to the pool for the next call
    rather than being closed with its last bytes unread (a new connection, and for a real
    provider a new TLS handshake, on every streamed call)."""
    with anyio.move_on_after(DRAIN_S):
        try:
            for _ in range(DRAIN_EVENTS):
                await opened.rest.__anext__()
        except DRAIN_ENDS:
            pass


def _cancelled(opened: Opened) -> Cancelled:
    """R-GW-7, R-GW-5b: the caller left or the deadline came; the usage the stream carried so
    far (Anthropic's input and cache tokens from `message_start`, the final counts if they had
    arrived), the cost at the estimate and marked `usage_estimated` unless both counts were
    seen; the token limits its head reported (R-TOK-4)."""
    tracker = opened.tracker
    return cancelled(tracker, estimated=not tracker.usage_known, limits=opened.limits)


async def _settle_failure(
    ctx: loop.Context, attempt: loop.Attempt, opened: Opened, failure: Classification, pace: Any
) -> None:
    # after the first content event nothing follows: no retry, no fallback (R-GW-5)
    ended = replace(pace, attempts_left=0) if pace is not None else None
    outcome = failed(failure, opened.tracker, limits=opened.limits)
    with anyio.CancelScope(shield=True):
        await settle_async(attempt, outcome, loop.sender(ctx, ended))


async def _settle_success(ctx: loop.Context, attempt: loop.Attempt, opened: Opened) -> None:
    # no usage in the stream: settled at the estimate, marked `usage_estimated` (R-GW-5)
    tracker = opened.tracker
    known = tracker.usage_known
    outcome = success(tracker if known else None, estimated=not known, limits=opened.limits)
    with anyio.CancelScope(shield=True):
        await settle_async(attempt, outcome, loop.sender(ctx, None))
