"""Every call the gateway makes to selection and reservation, in this one module (R-GW-2).

This is the seam where the routing issue's chains and pools (SPEC 18) wire in: the model a
request names is resolved here, the route chosen here, every reservation and settle made here
through the service's group committer (R-SRV-3: each checked as if alone, in one write
transaction, answered only after its commit). The retry and fallback decision is the one the
worker uses (`ledger.attempt.plan_follow_up` over the settle result of the policy table).
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from ledger.api import Ledger
from ledger.attempt import AttemptPlan, plan_follow_up
from ledger.errors import LedgerError, Refused
from ledger.gateway.errors import GatewayError, refused, seconds_until
from ledger.gateway.formats import registry
from ledger.gateway.formats.base import WireFormat
from ledger.gateway.formats.translate import native, serves
from ledger.kinds import AttemptRole, ExclusionReason, FailureKind, RefusalReason
from ledger.policy_table import InteractivePace
from ledger.records import Outcome, Reservation, SettleResult
from ledger.routing.chains import pool_members
from ledger.routing.kind import request_kind
from ledger.routing.select import Route, Selection
from ledger.store.group_commit import GroupCommit

WIRE_FORMAT = "wire_format"
"""Exclusion reason: the route speaks the other wire format and the request cannot be translated
(R-GW-3)."""
UNKNOWN_MODEL = "`model` names no catalog model key, pool or model id (see `ledger status`)"
POOL_PREFIX = "pool/"
AMBIGUOUS_MODEL = "`model` is a model id of several providers: name it as provider/model-id"
WAITING = frozenset(
    {ExclusionReason.PROVIDER_COOLDOWN, ExclusionReason.MODEL_COOLDOWN, ExclusionReason.PROBING,
     ExclusionReason.TOKEN_BUDGET, ExclusionReason.PROVIDER_TOKENS_EXHAUSTED}
)
"""Exclusions that end on their own: a pinned request is refused with them (429), not a 400."""
PINNED = "previous_response_id_pinned"
"""400 code: a request continuing a stored response has no native route of the provider that
keeps it (R-FMT-2: it never goes to another provider)."""
PINNED_TEXT = (
    "no route can serve this request: `previous_response_id` continues a response kept by"
    " provider {}, and no native route of that provider is in this request's routes"
)


def resolve_model(ledger: Ledger, text: str) -> str:
    """The catalog model key the request's `model` names: a model key, or a bare model id that
    names exactly one catalog model; otherwise a 400 naming the problem, never the value.

    A pool key (`pool/NAME`, R-RT-4) or a key with an effort suffix (R-RT-2) stands as written:
    the reserve picks the pool's concrete candidate in its write transaction (R-RT-5)."""
    if ledger.catalog.model(text) is not None:
        return text
    try:
        target = ledger.target(text)
    except LedgerError:
        target = None
    if target is not None and (target.is_pool or ledger.catalog.model(target.key) is not None):
        return text
    matches = [m.key for m in ledger.catalog.models if m.id == text]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise GatewayError(400, "ambiguous_model", AMBIGUOUS_MODEL)
    raise GatewayError(400, "unknown_model", UNKNOWN_MODEL)


MODEL_KIND = "model_kind"
"""400 code: the named model (or pool) serves the other kind of request (R-FMT-3)."""
OTHER_KIND = (
    "`model` names a model of the other kind: embedding models serve /openai/v1/embeddings only,"
    " chat models every other endpoint (R-FMT-3)"
)


def check_kind(ledger: Ledger, model: str, fmt: WireFormat) -> None:
    """A 400 `model_kind` when the resolved `model` serves another kind of request than the
    caller's format: nothing is reserved for a request no route of that model can take."""
    kind = request_kind(ledger.catalog, ledger.policy, ledger.target(model).key)
    if kind != fmt.kind:
        raise GatewayError(400, MODEL_KIND, OTHER_KIND)


def route_format(ledger: Ledger, route: str) -> WireFormat | None:
    """The wire format a route speaks (None: a format the gateway does not speak, or a pool
    whose candidates do not all speak one format)."""
    if route.startswith(POOL_PREFIX):
        formats = {route_format(ledger, m.key) for m in pool_members(ledger.policy, route)}
        return formats.pop() if len(formats) == 1 else None
    model = ledger.catalog.model(route)
    if model is None:
        return None
    return registry.for_route(ledger.catalog.providers[model.provider].api, model.serves)


def routable(ledger: Ledger, route: str, request: Request) -> bool:
    """A route the request can be sent to (R-GW-3): one of its own format, or of another one
    when the request is inside the internal form every format shares (else excluded
    `wire_format`; `formats.translate.serves`). A pool is routable when every candidate is
    (the reserve picks among them all): a pool mixing formats serves a request inside it."""
    if route.startswith(POOL_PREFIX):
        members = pool_members(ledger.policy, route)
        return bool(members) and all(routable(ledger, m.key, request) for m in members)
    fmt = route_format(ledger, route)
    if request.pinned is not None:  # R-FMT-2: a native route of the provider keeping it
        model = ledger.catalog.model(route)
        return native(fmt, request.fmt) and model is not None and model.provider == request.pinned
    return serves(fmt, request.fmt, request.translatable)


@dataclass(frozen=True)
class Request:
    """What every selection and reservation of one gateway request shares."""

    source: str
    model: str  # the model key the caller named
    fmt: WireFormat  # the caller's
    size: int  # conservative input bytes (the caller's whole body)
    request_id: str | None
    scopes: tuple[str, ...] = ()  # a gateway key's scopes (SPEC 20), passed on to reserve
    translatable: bool = False  # inside the common subset: other-format routes may serve it
    untranslated: str | None = None  # else the field outside it (fixed text), for the 400
    gateway_key: str | None = None  # its name: its own request ids and sources (R-SC-3a)
    pinned: str | None = None  # the provider keeping the response it continues (R-FMT-2)
    betas: tuple[str, ...] = ()  # the caller's opt-in flags (`anthropic-beta`, R-FMT-4)


def _routes(ledger: Ledger, request: Request, selection: Selection) -> list[str]:
    return [r for r in selection.routes if routable(ledger, r, request)]


def _selection(
    ledger: Ledger,
    request: Request,
    after_failure: FailureKind | None = None,
    failed_model: str | None = None,
    tried: frozenset[str] = frozenset(),
) -> Selection:
    return ledger.select(
        request.source,
        model=request.model,
        input_bytes=request.size,
        after_failure=after_failure,
        failed_model=failed_model,
        tried=tried,
    )


async def first_route(ledger: Ledger, request: Request) -> str:
    """The route of the request's first attempt, or the refusal / 400 saying why there is none."""
    selection = await anyio.to_thread.run_sync(_selection, ledger, request)
    routes = _routes(ledger, request, selection)
    if routes:
        return routes[0]
    reason = _primary_reason(ledger, request, selection)
    now = ledger.clock_fn()
    if request.pinned is not None:
        _refuse_pinned(ledger, request, selection, now)
    if selection.retry_at_ms is not None:
        subject = refusal_subject(ledger, reason, request.model)
        raise refused(reason, subject, selection.retry_at_ms, now)
    detail = ""
    if reason == WIRE_FORMAT and request.untranslated is not None:
        detail = f" ({request.untranslated} has no translation to the other wire format)"
    raise GatewayError(400, reason, f"no route can serve this request: {reason}{detail}")


def _refuse_pinned(ledger: Ledger, request: Request, selection: Selection, now: int) -> None:
    """Why a pinned request has no route (R-FMT-2): the pinned provider's native routes cooling
    or probing (429, the reason, their earliest end), else none of them is a route of the
    request (400 naming why). Never another provider."""
    mine = [
        e for e in selection.excluded
        if e.reason in WAITING and routable(ledger, e.model, request)
    ]  # fmt: skip
    if mine:
        first = mine[0]
        until = [e.until_ms for e in mine if e.until_ms is not None]
        at = min(until) if until else selection.retry_at_ms
        subject = refusal_subject(ledger, str(first.reason), first.model)
        raise refused(str(first.reason), subject, at, now)
    raise GatewayError(400, PINNED, PINNED_TEXT.format(request.pinned))


def named_route(ledger: Ledger, request: Request) -> Route | None:
    """The first attempt's route without a selection, when only the ledger's state could keep
    the named model out: a catalog model key (not a pool) the request can be sent to (R-GW-3)
    that catalog and policy alone allow for a request this size. It is the route selection would
    put first (R-SEL-2: the default model, with the named effort). Its reserve checks every
    cooldown, probe and cap in the write transaction, and a refusal goes back to the selection
    (`after_refusal`), so the answer is the one a selection first would have given. None:
    select first; always with an Idempotency-Key, whose repeat must find the route its first
    answer took (a backup, when the named model was cooling then)."""
    if request.request_id is not None:
        return None
    target = ledger.target(request.model)
    if target.is_pool or not routable(ledger, target.key, request):
        return None
    if not ledger.callable_alone(target.key, request.size):
        return None
    return Route(target.key, target.effort)


async def after_refusal(ledger: Ledger, request: Request, route: str, refusal: GatewayError) -> str:
    """The first attempt's route after the named route's reserve was refused: the selection's
    first route when it is another one (the named model cooling: its backup), else that refusal
    (a budget or cap no other route escapes), or the selection's own refusal or 400. A token
    refusal the selection repeats (the route left out for it, none other) stays the reserve's:
    it names the window and its limit, or what the provider said is left (R-TOK-2, R-TOK-4)."""
    try:
        chosen = await first_route(ledger, request)
    except GatewayError as none:
        if none.status == 429 and refusal.code in _TOKEN_REFUSALS and none.code == refusal.code:
            raise refusal from None
        raise
    if chosen == route:
        raise refusal
    return chosen


_TOKEN_REFUSALS = frozenset({RefusalReason.TOKEN_BUDGET, RefusalReason.PROVIDER_TOKENS_EXHAUSTED})


def _primary_reason(ledger: Ledger, request: Request, selection: Selection) -> str:
    if request.model in selection.routes and not routable(ledger, request.model, request):
        return WIRE_FORMAT
    for exclusion in selection.excluded:
        if exclusion.model == request.model:
            return str(exclusion.reason)
    if any(not routable(ledger, r, request) for r in selection.routes):
        return WIRE_FORMAT
    return "no_route"


def retry_after_s(at_ms: int | None, now_ms: int) -> int | None:
    """Whole seconds until `at_ms` (at least 1), for a Retry-After header."""
    return seconds_until(at_ms, now_ms)


# a refusal no scope or model made: what refused, in the ledger's own words
_SUBJECTS: dict[str, str] = {
    RefusalReason.SHARED_HOURLY_BUDGET: "the shared hourly budget",
    RefusalReason.DAILY_COST_CEILING: "the daily cost ceiling",
    RefusalReason.SOURCE_SETTLED: "this request's source",
    RefusalReason.SOURCE_PAUSED: "this request's source",
    RefusalReason.SOURCE_BACKOFF: "this request's source",
    RefusalReason.SOURCE_CALLS: "this request's source",
    RefusalReason.SOURCE_MODELS: "this request's source",
    RefusalReason.SOURCE_TIME: "this request's source",
}


def refusal_subject(ledger: Ledger, reason: str, route: str, scope: str | None = None) -> str:
    """The scope or target that refused (R-GW-6a), named as the ledger knows it: a scope from the
    policy, a provider or model key from the catalog, a pool from the policy, or a fixed phrase
    (never the caller's source id: it is the caller's own text)."""
    if scope is not None:
        return f"scope {scope}"
    fixed = _SUBJECTS.get(reason)
    if fixed is not None:
        return fixed
    if route.startswith(POOL_PREFIX):
        return f"pool {route.removeprefix(POOL_PREFIX)}"
    model = ledger.catalog.model(ledger.target(route).key)
    if model is None:
        return "the requested model"
    if reason == RefusalReason.PROVIDER_COOLDOWN:
        return f"provider {model.provider}"
    return f"model {model.key}"


async def reserve(
    ledger: Ledger,
    group: GroupCommit,
    request: Request,
    route: str,
    attempt: int,
    plan: AttemptPlan | None,
) -> Reservation:
    """One reservation (every section 7 check in one write transaction); a refusal is 429.

    The Idempotency-Key is the first attempt's request id (R-RES-10a); later attempts of the
    request carry it with their number, so each attempt is its own reservation. A gateway key's
    ids are its own namespace, and its source is checked in the same transaction: a source
    outside its scopes raises SourceScopeMismatch, the endpoint's 403 (R-SC-3a)."""
    request_id = request.request_id
    if request_id is not None and attempt > 1:
        request_id = f"{request_id}#{attempt}"
    step = ledger.reserve_step(
        request.source,
        route,
        input_bytes=request.size,
        request_id=request_id,
        role=plan.role if plan is not None else AttemptRole.PRIMARY,
        fallback_from=plan.fallback_from if plan is not None else None,
        after=plan.after if plan is not None else None,
        scopes=request.scopes,  # a gateway key's scopes (R-SC-1, R-SC-3)
        gateway_key=request.gateway_key,
    )
    try:
        return await group.submit(step)
    except Refused as refusal:
        now = refusal.now_ms if refusal.now_ms is not None else ledger.clock_fn()
        subject = refusal_subject(ledger, refusal.reason, route, refusal.scope)
        if refusal.reason in _TOKEN_REFUSALS and refusal.detail:
            subject = refusal.detail  # R-TOK-2, R-TOK-4: its window, limit and target
        raise refused(refusal.reason, subject, refusal.retry_at_ms, now, refusal.scope) from None


async def settle(
    ledger: Ledger,
    group: GroupCommit,
    reservation_id: int,
    outcome: Outcome,
    pace: InteractivePace | None,
    *,
    overran: bool = False,
) -> SettleResult:
    """Settle one attempt through the policy table (one write transaction, group commit).

    Shielded: a caller who leaves meanwhile never abandons a settle half-way (R-GW-7)."""
    step = ledger.settle_step(reservation_id, outcome, overran=overran, pace=pace)
    with anyio.CancelScope(shield=True):
        settled = await group.submit(step)
    return settled


async def follow_up(
    ledger: Ledger, request: Request, settled: SettleResult, tried: frozenset[str]
) -> AttemptPlan | None:
    """The follow-up the failure permits (the worker's own decision), in the request's format."""

    def routes(kind: FailureKind | None, failed: str, seen: frozenset[str]) -> list[str]:
        selection = _selection(ledger, request, kind, failed, seen)
        return _routes(ledger, request, selection)

    return await anyio.to_thread.run_sync(plan_follow_up, settled, settled.model, tried, routes)
