"""The gateway's routes (R-GW-1, R-FMT-1): one `POST` for each registered wire format (its
`path`: `/openai/v1/chat/completions`, `/anthropic/v1/messages`) and a `GET` listing the models
where a format has one (`/openai/v1/models`), mounted by the service on the same listeners as
`/v1`. A format registered later is mounted on the router then (`registry.subscribe`).

Each route parses and checks the caller's body (a 4xx in the caller's format, nothing upstream),
then hands it to the request loop (loop.py) or, for `stream: true`, to stream.py. Bodies are never
logged or stored; error answers hold fixed text only.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ledger.api import Ledger
from ledger.arguments import check_request_id, check_source_id
from ledger.errors import LedgerError, SourceScopeMismatch, UsageError
from ledger.gateway import count_tokens, kept, loop, routing
from ledger.gateway.errors import GatewayError
from ledger.gateway.formats import registry
from ledger.gateway.formats.base import WireFormat
from ledger.gateway.formats.translate import reply_for
from ledger.gateway.gate import KEY_STATE
from ledger.gateway.metrics import GatewayMetrics
from ledger.gateway.refusal_tally import RefusalTally
from ledger.gateway.sse import Malformed
from ledger.gateway.stream import RelayedResponse, serve_stream, unless_disconnected
from ledger.gateway.upstream import MALFORMED, Reply, call, transport
from ledger.gateway.wire import UNFIT, answer_headers, answer_model, beta_flags
from ledger.routing.kind import request_kind
from ledger.telemetry import gateway_request, refused

router = APIRouter(include_in_schema=False)

SOURCE_HEADER = "x-ledger-source"
PACE_HEADER = "x-ledger-pace"
BAD_JSON = "the body is not valid JSON"
BAD_SOURCE = "X-Ledger-Source must be a source id (1-200 printable characters)"
MAX_KEY = 190  # later attempts carry it with `#N` (R-RES-10a request ids hold 200)
BAD_KEY = "Idempotency-Key must be 1-190 printable characters"
BAD_PACE = "X-Ledger-Pace must be `interactive` or `background`"
SOURCE_SCOPE_MISMATCH = (
    "X-Ledger-Source names a source this key may not use: a key's source is new or under the"
    " key's scopes only (R-SC-3a)"
)


def error_answer(fmt: WireFormat, error: GatewayError) -> JSONResponse:
    """A gateway error in the caller's format (R-GW-6); 429s carry Retry-After when known."""
    headers: dict[str, str] = {}
    if error.retry_after_s is not None:
        headers["retry-after"] = str(error.retry_after_s)
    if error.should_retry is not None:  # R-GW-6a: both official SDK families obey it
        headers["x-should-retry"] = "true" if error.should_retry else "false"
    if error.attempts:
        headers["x-ledger-attempts"] = str(error.attempts)
    document = fmt.error_document(error.status, error.code, error.message)
    return JSONResponse(document, status_code=error.status, headers=headers)


def context_of(request: Request, template: str) -> loop.Context:
    """The service's ledger, group committer, upstream connections and gateway metrics (the last
    two made on first use, on the event loop, so never twice)."""
    state = request.app.state
    upstream = getattr(state, "gateway_upstream", None)
    if upstream is None:
        upstream = transport()
        state.gateway_upstream = upstream
    return loop.Context(state.ledger, state.group, upstream, metrics_of(request), template)


def tally_of(request: Request) -> RefusalTally:
    """The service's refusal counts (made on first use, on the event loop, so never twice)."""
    state = request.app.state
    tally: RefusalTally | None = getattr(state, "refusal_tally", None)
    if tally is None:
        group = state.group
        tally = state.refusal_tally = RefusalTally(group.submit, group.run)
    return tally


def _count_refusal(request: Request, ctx: loop.Context, error: GatewayError) -> None:
    """R-DIAG-1: a refusal counted by reason, the scope that refused and the key that asked."""
    key = request.scope.get("state", {}).get(KEY_STATE)
    name = getattr(key, "name", None)
    tally_of(request).count(ctx.ledger.clock_fn(), error.code, error.scope, name)
    refused(error.code)  # R-OTEL-1: the refusal's reason on the request's span
    if ctx.metrics is not None:
        ctx.metrics.refusal(error.code, error.scope, name)


def metrics_of(request: Request) -> GatewayMetrics | None:
    """The gateway's series in the service's registry (None when the app keeps no metrics)."""
    state = request.app.state
    found = getattr(state, "gateway_metrics", None)
    if found is None and hasattr(state, "metrics"):
        found = state.gateway_metrics = GatewayMetrics(state.metrics.registry)
    return found


def _models(fmt: WireFormat) -> Callable[[Request], Awaitable[Response]]:
    async def models(request: Request) -> Response:
        """The catalog's models and pools (ids are model keys) in the format's list."""
        ledger: Ledger = request.app.state.ledger
        listed = [(m.key, m.provider, m.serves) for m in ledger.catalog.models]
        # a pool key is a model a request may name too (R-RT-4)
        listed += [
            (f"pool/{name}", "ledger", request_kind(ledger.catalog, ledger.policy, f"pool/{name}"))
            for name in sorted(ledger.policy.pools)
        ]
        return JSONResponse(fmt.models_document(listed))

    return models


def _endpoint(fmt: WireFormat) -> Callable[[Request], Awaitable[Response]]:
    async def serve(request: Request) -> Response:
        """A request in this wire format through the ledger (R-GW-2)."""
        return await _serve(request, fmt)

    return serve


def mount(fmt: WireFormat) -> None:
    """The format's routes on the gateway's router."""
    if fmt.models_path is not None:
        router.add_api_route(fmt.models_path, _models(fmt), methods=["GET"])
    router.add_api_route(fmt.path, _endpoint(fmt), methods=["POST"])


async def _serve(request: Request, fmt: WireFormat) -> Response:
    template = fmt.path
    ctx = context_of(request, template)
    with gateway_request(request.headers, template) as traced:  # R-OTEL-1
        answer = await _answer(request, fmt, ctx)
        traced.answered(answer.status_code, streaming=isinstance(answer, RelayedResponse))
    if ctx.metrics is not None and not isinstance(answer, RelayedResponse):
        ctx.metrics.request(template, _outcome(answer.status_code))  # a stream counts its own
    return answer


def _outcome(status: int) -> str:
    if status < 300:
        return "answered"
    if status == 429:
        return "refused"
    return "bad_request" if status < 500 and status != 408 else "failed"


async def _answer(request: Request, fmt: WireFormat, ctx: loop.Context) -> Response:
    try:
        body, gw_request, background = _parse(request, ctx.ledger, fmt, await request.body())
        gw_request = await kept.pin(ctx.ledger, fmt, body, gw_request)  # R-FMT-2
        if fmt.streams(body):
            return await serve_stream(ctx, gw_request, body, background, request)
        answered = await unless_disconnected(  # R-GW-7: the caller may leave meanwhile
            request.receive,
            lambda: loop.run(ctx, gw_request, body, call_exchange, background=background),
        )
        if answered is None:  # the caller left: upstream closed, the attempt settled cancelled
            return Response(status_code=499)
    except GatewayError as error:
        if error.status == 429:
            _count_refusal(request, ctx, error)
        return error_answer(fmt, error)
    except SourceScopeMismatch:  # R-SC-3a: found in the reserve's transaction, nothing reserved
        return error_answer(fmt, GatewayError(403, "source_scope_mismatch", SOURCE_SCOPE_MISMATCH))
    except UsageError as error:  # fixed text by construction (never a value)
        return error_answer(fmt, GatewayError(400, "bad_request", str(error)))
    except LedgerError as error:  # busy or unreadable database: retry later
        return error_answer(fmt, GatewayError(503, "unavailable", type(error).__doc__ or "busy"))
    document = answered.document
    assert document is not None
    attempt = answered.attempt
    await kept.keep(ctx, attempt, document.get("id"))  # R-FMT-2, before the caller has it
    return JSONResponse(answer_model(document, attempt.route), headers=answer_headers(attempt))


async def call_exchange(ctx: loop.Context, attempt: loop.Attempt) -> Any:
    """The non-streaming exchange of one attempt, bounded by its reservation deadline."""
    remaining = (attempt.reservation.deadline_ms - ctx.ledger.clock_fn()) / 1000
    reply = await call(ctx.upstream, attempt.prepared, remaining, ctx.ledger.clock_fn)
    prepared = attempt.prepared
    if reply.document is not None:
        try:
            reply.document = reply_for(prepared.caller, prepared.fmt, reply.document)
        except Malformed:
            return Reply(None, None, MALFORMED, reply.elapsed_ms)
    return reply


def _no_constant(name: str) -> Any:
    raise ValueError("not JSON")  # the name is never shown: the answer says BAD_JSON


def _fits(ledger: Ledger, fmt: WireFormat, model: str, body: dict[str, Any]) -> bool:
    """Whether the named model's reply allowance can serve the body (`fmt.fits_allowance`: `n`,
    thinking); a pool's pick, and a backup, are checked when prepared."""
    target = ledger.target(model)
    if target.is_pool:
        return True
    allowance = ledger.model(target.key).reply_reservation(ledger.policy.reply_tokens)
    return fmt.fits_allowance(body, allowance)


def _parse(
    request: Request, ledger: Ledger, fmt: WireFormat, raw: bytes
) -> tuple[dict[str, Any], routing.Request, bool]:
    try:  # JSON as RFC 8259 has it: NaN and Infinity would go upstream as invalid JSON
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise GatewayError(400, "invalid_json", BAD_JSON) from None
    problem = fmt.check(body)
    if problem is not None:
        raise GatewayError(400, "invalid_request", problem)
    model = routing.resolve_model(ledger, body["model"])
    routing.check_kind(ledger, model, fmt)  # R-FMT-3: never chat on an embedding model
    if not _fits(ledger, fmt, model, body):  # nothing reserved for what cannot be sent
        raise GatewayError(400, "invalid_request", UNFIT)
    headers = request.headers
    source = headers.get(SOURCE_HEADER)
    try:
        source = check_source_id(source) if source is not None else f"gw-{secrets.token_hex(8)}"
    except UsageError:
        raise GatewayError(400, "bad_source", BAD_SOURCE) from None
    key = headers.get("idempotency-key")
    try:
        request_id = check_request_id(key) if key is not None else None
        if request_id is not None and len(request_id) > MAX_KEY:
            raise UsageError(BAD_KEY)
    except UsageError:
        raise GatewayError(400, "bad_idempotency_key", BAD_KEY) from None
    gateway_key = request.scope.get("state", {}).get(KEY_STATE)
    key_name: str | None = getattr(gateway_key, "name", None)
    if headers.get(SOURCE_HEADER) is None and request_id is not None:
        # a repeated request is the same request: the same source, so the key finds its slot;
        # a gateway key's ids are its own (R-SC-3a), so are the sources they name
        seed = request_id if key_name is None else f"key:{key_name}\n{request_id}"
        source = "gw-" + hashlib.sha256(seed.encode()).hexdigest()[:24]
    pace = headers.get(PACE_HEADER, "interactive")
    if pace not in ("interactive", "background"):
        raise GatewayError(400, "bad_pace", BAD_PACE)
    scopes = tuple(getattr(gateway_key, "scopes", ()))  # seam: SPEC 20 scopes go to reserve
    outside = fmt.outside(body)
    betas = beta_flags(headers.get(fmt.beta_header) if fmt.beta_header else None)
    gw_request = routing.Request(
        source, model, fmt, len(raw), request_id, scopes, outside is None, outside, key_name,
        betas=betas,
    )  # fmt: skip
    return body, gw_request, pace == "background"


registry.subscribe(mount)
# R-FMT-4: Claude Code's token count, unreserved, on a route that can count (count_tokens.py)
router.add_api_route(count_tokens.PATH, count_tokens.serve, methods=["POST"])
