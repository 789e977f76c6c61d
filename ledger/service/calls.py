"""`/v1/reserve`, `/v1/settle`, `/v1/select`: parse, call one `Ledger` method, render its JSON.

Reserve and settle check their arguments on the event loop (no I/O) and hand the write to the
service's committer thread (group_commit.py): requests that arrive together are written in one
transaction, each checked as if it ran alone, in arrival order, and answered only once that
transaction has committed. Select is a plain function, so FastAPI runs it in a worker thread.
Either way the database work (and SQLite's fsync) never runs on the event loop, and the request
body was read in full before the transaction starts, the answer written only after it ended.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ledger.api import Ledger
from ledger.classify import Classification, classify_http
from ledger.clock import now_ms
from ledger.errors import LedgerError
from ledger.learned import LearnedLimit, LearnedLimits
from ledger.records import Cancelled, Failed, Outcome, Success
from ledger.service.answers import ReservationOut, SelectionOut, SettleOut
from ledger.service.bodies import (
    CancelledOutcome,
    EvolveBody,
    FailedOutcome,
    HttpOutcome,
    LearnedLimitsBody,
    ReserveBody,
    SelectBody,
    SettleBody,
    SuccessOutcome,
)
from ledger.service.openapi import GATE, WITH_BODY, errors
from ledger.store.group_commit import GroupCommit

router = APIRouter(prefix="/v1", tags=["calls"])
ERRORS: dict[int | str, dict[str, Any]] = errors(*GATE, json_ref=True)
"""What any route can answer before it runs (the gate): for routes whose answer is not JSON."""


async def ledger_of(request: Request) -> Ledger:
    """The service's one `Ledger` (policy and catalog read once at start)."""
    ledger: Ledger = request.app.state.ledger
    return ledger


LedgerDep = Annotated[Ledger, Depends(ledger_of)]


async def group_of(request: Request) -> GroupCommit:
    """The service's one group committer (every reserve and settle goes through it)."""
    group: GroupCommit = request.app.state.group
    return group


GroupDep = Annotated[GroupCommit, Depends(group_of)]


def limits_of(body: LearnedLimitsBody | None) -> LearnedLimits | None:
    """The library's learned limits for the wire's (R-TOK-4)."""
    if body is None:
        return None
    return LearnedLimits(
        body.read_at_ms,
        tuple(LearnedLimit(x.kind, x.remaining, x.reset_at_ms, x.limit) for x in body.limits),
    )


def outcome_of(
    body: SuccessOutcome | CancelledOutcome | FailedOutcome | HttpOutcome, now: int
) -> Outcome:
    """The library's outcome for a wire outcome (an HTTP status is classified here, as the CLI)."""
    if isinstance(body, SuccessOutcome):
        return Success(
            body.input_tokens,
            body.output_tokens,
            body.cost_usd,
            body.finish,
            body.cache_write_tokens,
            body.cache_read_tokens,
            limits=limits_of(body.limits),
        )
    if isinstance(body, CancelledOutcome):
        return Cancelled(limits=limits_of(body.limits))
    if isinstance(body, HttpOutcome):
        headers = {"retry-after": body.retry_after} if body.retry_after is not None else {}
        error = json.dumps({"error": {"code": body.code}}).encode() if body.code else None
        return Failed(classify_http(body.http_status, headers, error, now), body.side_effects)
    classification = Classification(
        body.kind, body.subkind, body.retry_after_ms, body.reset_at_ms, body.reason
    )
    return Failed(
        classification,
        body.side_effects,
        body.input_tokens,
        body.output_tokens,
        body.cache_write_tokens,
        body.cache_read_tokens,
        limits=limits_of(body.limits),
    )


@router.post(
    "/reserve",
    operation_id="reserve",
    response_model=ReservationOut,
    responses=errors(*WITH_BODY, 404, 409),
)
async def reserve(body: ReserveBody, ledger: LedgerDep, group: GroupDep) -> JSONResponse:
    """Permission for one provider call, or 409 with the refusal's reason code."""
    step = ledger.reserve_step(
        body.source,
        body.model,
        input_bytes=body.input_bytes,
        text=body.text,
        request_id=body.request_id,
        override=body.override,
        role=body.role,
        fallback_from=body.fallback_from,
        after=body.after,
        scopes=body.scopes,
    )
    return JSONResponse((await group.submit(step)).to_json())


@router.post(
    "/evolve", operation_id="evolve", response_model=ReservationOut,
    responses=errors(*WITH_BODY, 404, 409),
)  # fmt: skip
async def evolve(body: EvolveBody, ledger: LedgerDep, group: GroupDep) -> JSONResponse:
    """One explicit override attempt on a known source (R-RES-9): 404 `unknown source` for an
    id the ledger does not know (nothing is created, no call is spent)."""
    step = ledger.evolve_step(body.source, body.model, input_bytes=body.input_bytes)
    return JSONResponse((await group.submit(step)).to_json())


@router.post(
    "/settle", operation_id="settle", response_model=SettleOut, responses=errors(*WITH_BODY, 404)
)
async def settle(body: SettleBody, ledger: LedgerDep, group: GroupDep) -> JSONResponse:
    """Record a reservation's outcome; the answer lists every action the policy table applied."""
    outcome = outcome_of(body.outcome, now_ms())
    step = ledger.settle_step(body.reservation, outcome, overran=body.overran)
    return JSONResponse((await group.submit(step)).to_json())


@router.post(
    "/select", operation_id="select", response_model=SelectionOut, responses=errors(*WITH_BODY)
)
def select(body: SelectBody, ledger: LedgerDep) -> JSONResponse:
    """Ordered eligible routes and every exclusion (an empty route list is still a 200)."""
    for key in body.tried:
        ledger.model(key)
    selection = ledger.select(
        body.source,
        model=body.model,
        input_bytes=body.input_bytes,
        text=body.text,
        after_failure=body.after_failure,
        failed_model=body.failed_model,
        tried=frozenset(body.tried),
    )
    return JSONResponse(selection.to_json(ledger.catalog))


Endpoint = Callable[[Any, Ledger, GroupCommit], Awaitable[JSONResponse]]
DIRECT: dict[str, tuple[type[BaseModel], Endpoint]] = {
    "/v1/reserve": (ReserveBody, reserve),
    "/v1/settle": (SettleBody, settle),
    "/v1/evolve": (EvolveBody, evolve),
}
"""The routes `DirectCalls` answers: their body model and endpoint."""


class DirectCalls:
    """Reserve, settle and evolve answered straight from the gate, past FastAPI's stack (its
    middleware layers, routing, dependency solving: most of a request's cost in the service
    besides the write itself), with the same endpoint, the same answer and the same error
    handler. Only a body that parses and validates is taken (nothing has happened yet when it
    does not): any other request goes on to FastAPI, which answers it as always, and so does
    every request while FastAPI's own telemetry is on (an OpenTelemetry provider configured in
    the process), so that it observes every request as before."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.routes = {  # the app includes `router` as it is (no prefix of its own)
            route.path: route
            for route in router.routes
            if isinstance(route, APIRoute)
            and route.path in DIRECT
            and "POST" in (route.methods or ())
        }
        assert len(self.routes) == len(DIRECT)

    async def __call__(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> bool:
        """Answer the request if it is one of `DIRECT`'s with a valid body (True), else False."""
        route = self.routes.get(scope["path"])
        if route is None or scope["method"] != "POST":
            return False
        telemetry = getattr(self.app, "_native_telemetry", None)
        if telemetry is None or telemetry.enabled():
            return False
        model, endpoint = DIRECT[route.path]
        try:
            parsed = model.model_validate(json.loads(body))
        except ValueError:  # not JSON, or invalid (ValidationError): FastAPI's error answers it
            return False
        scope["route"] = route  # as FastAPI sets it: the metrics label
        state = self.app.state
        response: Response
        try:
            response = await endpoint(parsed, state.ledger, state.group)
        except LedgerError as exc:  # the handler FastAPI's exception middleware would call
            handler = self.app.exception_handlers[LedgerError]
            answer = handler(Request(scope, receive), exc)  # `errors.install`'s, async
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)
        return True
