"""Stored responses through the gateway (R-FMT-2): a request continuing a kept answer is pinned
to the provider that keeps it, and a kept answer's id is recorded with the provider and model
that answered it (metadata only, never a body; `ledger.store.stored_responses`).

Both run off the event loop (R-GW-8): the lookup in a worker thread, the record through the
service's group committer, before the caller has the answer (a caller who continues at once
finds the record).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import anyio

from ledger.api import Ledger
from ledger.errors import LedgerError
from ledger.gateway import loop, routing
from ledger.gateway.formats.base import WireFormat
from ledger.routing.chains import pool_members
from ledger.store.batch import Step
from ledger.store.stored_responses import provider_of, remember


async def pin(
    ledger: Ledger, fmt: WireFormat, body: dict[str, Any], request: routing.Request
) -> routing.Request:
    """The request pinned to the provider keeping the response it continues: the provider
    recorded for that id, else (an id the ledger does not know) the requested route's own."""
    previous = fmt.previous(body)
    if previous is None:
        return request
    now = ledger.clock_fn()
    provider = await anyio.to_thread.run_sync(provider_of, ledger.db, previous, now)
    if provider is None:
        target = ledger.target(request.model)
        key = target.key
        if target.is_pool:
            members = pool_members(ledger.policy, request.model)
            key = members[0].key if members else key
        model = ledger.catalog.model(key)
        provider = model.provider if model is not None else None
    return replace(request, pinned=provider or "")


async def keep(ctx: loop.Context, attempt: loop.Attempt, answer_id: object) -> None:
    """Record who answered a kept answer (its format keeps it on a native route). Best-effort:
    a busy or failing database never costs the caller the answer (its reservation is settled
    apart); a continuation of an id not recorded is pinned to its route's own provider."""
    if not attempt.prepared.keep or not isinstance(answer_id, str) or not answer_id:
        return
    model = ctx.ledger.model(attempt.reservation.model)
    provider, key = model.provider, model.key
    step: Step[None] = Step(lambda conn, now: remember(conn, now, answer_id, provider, key))
    with contextlib.suppress(LedgerError):
        await ctx.group.submit(step)
