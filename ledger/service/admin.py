"""`/v1/cooldowns`, `/v1/sources`, `/v1/catalog`: the operator commands `ledger cooldown …` /
`ledger source …`, and the catalog a worker with `--server` calls providers by.

Each route is one library call in a worker thread, answering the JSON the CLI's `--json` prints.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ledger.catalog import Catalog
from ledger.clock import parse_duration_ms
from ledger.documents import change_json, set_json, source_document, source_json
from ledger.errors import NotFoundError, UsageError
from ledger.service.answers import (
    CooldownClearOut,
    CooldownSetOut,
    CooldownsOut,
    SourceAddOut,
    SourceDetailOut,
    SourcesOut,
    SourceStateOut,
)
from ledger.service.bodies import CooldownBody, SourceBody, SourceStateBody
from ledger.service.calls import LedgerDep
from ledger.service.openapi import GATE, PATH_PARAM, WITH_BODY, errors
from ledger.store.views import cooldown_list, source_detail, source_rows

router = APIRouter(prefix="/v1", tags=["operators"])


@router.get("/catalog", operation_id="catalog", response_model=Catalog, responses=errors(*GATE))
def catalog(ledger: LedgerDep) -> JSONResponse:
    """The served ledger's catalog as catalog.json holds it (provider names, base URLs and the
    names of credential variables, never a credential), so a worker with `--server` calls the
    same models the service reserves (issue 33)."""
    return JSONResponse(ledger.catalog.to_json())


@router.get(
    "/cooldowns",
    operation_id="list_cooldowns",
    response_model=CooldownsOut,
    responses=errors(*GATE),
)
def list_cooldowns(ledger: LedgerDep) -> JSONResponse:
    """Active cooldowns with time left, kind and origin (`ledger cooldown list --json`)."""
    now, rows = cooldown_list(ledger.db)
    return JSONResponse({"cooldowns": [c.to_json(now) for c in rows]})


@router.post(
    "/cooldowns",
    operation_id="set_cooldown",
    response_model=CooldownSetOut,
    responses=errors(*WITH_BODY),
)
def set_cooldown(body: CooldownBody, ledger: LedgerDep) -> JSONResponse:
    """A manual cooldown on a provider or a model (`ledger cooldown set --json`)."""
    ms = parse_duration_ms(body.duration)
    if body.reason is not None and (len(body.reason) > 200 or not body.reason.isprintable()):
        raise UsageError("a reason must be at most 200 printable characters")
    scope, key = ledger.cooldown_target(body.target)
    return JSONResponse(set_json(ledger.store.set_cooldown(scope, key, ms, body.reason)))


@router.delete(
    "/cooldowns/{target:path}",
    operation_id="clear_cooldown",
    response_model=CooldownClearOut,
    responses=errors(*GATE, *PATH_PARAM, 400, 422),
)
def clear_cooldown(target: str, ledger: LedgerDep, force: bool = False) -> JSONResponse:
    """Remove manual cooldowns on a target; `force=true` also policy and hint ones."""
    scope, key = ledger.cooldown_target(target)
    change = ledger.store.clear_cooldown(scope, key, force)
    return JSONResponse({**change_json(change), "target": target, "removed": change.removed})


@router.get(
    "/sources", operation_id="list_sources", response_model=SourcesOut, responses=errors(*GATE)
)
def list_sources(ledger: LedgerDep) -> JSONResponse:
    """Sources with state and counters (`ledger source list --json`)."""
    return JSONResponse({"sources": [source_json(r) for r in source_rows(ledger.db)]})


@router.post(
    "/sources",
    operation_id="add_source",
    response_model=SourceAddOut,
    responses=errors(*WITH_BODY),
)
def add_source(body: SourceBody, ledger: LedgerDep) -> JSONResponse:
    """Create a source and (by default) queue it for workers."""
    created = ledger.add_source(body.source, body.payload_ref, body.enqueue, scopes=body.scopes)
    return JSONResponse({"source": body.source, "created": created, "queued": body.enqueue})


@router.post(
    "/sources/{action}",
    operation_id="set_source_state",
    response_model=SourceStateOut,
    responses=errors(*WITH_BODY, *PATH_PARAM, 404, 409),
)
def set_source_state(
    action: Literal["pause", "resume", "done"], body: SourceStateBody, ledger: LedgerDep
) -> JSONResponse:
    """Pause, resume or finish a source (a paused one keeps its reason: `already`)."""
    return JSONResponse(ledger.set_source_state(body.source, action).to_json())


@router.get(
    "/sources/{source_id:path}",
    operation_id="show_source",
    response_model=SourceDetailOut,
    responses=errors(*GATE, *PATH_PARAM, 404),
)
def show_source(source_id: str, ledger: LedgerDep) -> JSONResponse:
    """One source's counters and whole failover history (`ledger source show --json`)."""
    detail: dict[str, Any] | None = source_detail(ledger.db, source_id)
    if detail is None:
        raise NotFoundError("unknown source")
    return JSONResponse(source_document(detail))
