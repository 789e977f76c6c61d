"""The gateway's first attempt without a selection (R-GW-2, R-SEL-2): when only the ledger's state
could keep the named model out, the named model is reserved at once, and a refusal goes back to
the selection, so every request is answered by the route (or refused for the reason) a selection
first would have given. In process, on a real migrated SQLite file, with a recording exchange in
place of the upstream (the end-to-end paths are in test_gateway*.py against `ledger serve`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger.api import Ledger
from ledger.classify import Classification
from ledger.gateway import loop, routing
from ledger.gateway.errors import GatewayError
from ledger.gateway.formats import Format, WireFormat
from ledger.gateway.upstream import Reply
from ledger.kinds import FailureKind
from ledger.providers.base import ProviderResponse
from ledger.records import Failed
from ledger.store import sqlite_driver
from ledger.store.group_commit import GroupCommit
from tests.support.gateway_setup import (
    MINIMAL_COMPLETION,
    STANDIN_KEY,
    UNREACHED_UPSTREAM,
    gateway_catalog,
)

UPSTREAM = UNREACHED_UPSTREAM
DOCUMENT = MINIMAL_COMPLETION


def _ledger(home: Path, env: dict[str, str] | None = None, **policy: Any) -> Ledger:
    (home / "catalog.json").write_text(json.dumps(gateway_catalog(UPSTREAM)))  # type: ignore[arg-type]
    (home / "recovery.json").write_text(json.dumps(policy))
    return Ledger.open(home, env={"BOLT_KEY": STANDIN_KEY} if env is None else env)


@pytest.fixture
def ledger(home: Path) -> Iterator[Ledger]:
    opened = _ledger(home)
    try:
        yield opened
    finally:
        opened.close()


def _request(
    model: str, *, fmt: WireFormat = Format.OPENAI, size: int = 100, key: str | None = None,
    translatable: bool = True, source: str = "gw-s",
) -> routing.Request:  # fmt: skip
    return routing.Request(source, model, fmt, size, key, (), translatable)


def _first_route(ledger: Ledger, request: routing.Request) -> Any:
    return asyncio.run(routing.first_route(ledger, request))


def _serve(ledger: Ledger, request: routing.Request) -> tuple[loop.Answered, list[str]]:
    """loop.run with an exchange that records each attempt's route and answers it."""
    asked: list[str] = []

    async def exchange(ctx: loop.Context, attempt: loop.Attempt) -> Reply:
        asked.append(attempt.route)
        return Reply(DOCUMENT, ProviderResponse(ok=True, status=200, input_tokens=3,
                                                output_tokens=2), None)  # fmt: skip

    async def run() -> loop.Answered:
        group = GroupCommit(ledger.write_steps)
        try:
            async with httpx.AsyncHTTPTransport() as upstream:
                ctx = loop.Context(ledger, group, upstream)
                return await loop.run(ctx, request, {"model": request.model}, exchange)
        finally:
            group.close()

    return asyncio.run(run()), asked


def _rate_limit(ledger: Ledger, model: str) -> None:
    """A 429 with a long Retry-After on `model`: its provider cools (the policy table)."""
    held = ledger.reserve("cooler", model, input_bytes=10)
    limited = Classification(FailureKind.RATE_LIMIT, "http_429", retry_after_ms=600_000)
    ledger.settle(held.id, Failed(limited))


def _reservations(home: Path, source: str) -> int:
    with sqlite_driver.connect(home / "ledger.db") as db:
        (count,) = db.execute(
            "SELECT count(*) FROM reservations WHERE source_id = ?", (source,)
        ).fetchone()
    return int(count)


@pytest.mark.parametrize(
    ("model", "fmt"),
    [("acme/a1", Format.OPENAI), ("acme/a1:high", Format.OPENAI),
     ("bolt/b1", Format.ANTHROPIC), ("bolt/b1", Format.OPENAI), ("cirrus/c1", Format.ANTHROPIC)],
)  # fmt: skip
def test_r_gw_2_r_sel_2_the_named_route_is_the_route_a_selection_puts_first(
    ledger: Ledger, model: str, fmt: WireFormat
) -> None:
    request = _request(model, fmt=fmt)
    named = routing.named_route(ledger, request)
    selected = _first_route(ledger, request)
    assert named is not None
    assert (str(named), named.effort) == (str(selected), selected.effort)


def test_r_gw_2_catalog_and_policy_cases_still_select_first(home: Path) -> None:
    """Where catalog or policy alone exclude the named model, or a pool picks, or an
    Idempotency-Key must find its first answer's route, the selection runs first."""
    ledger = _ledger(home, env={}, pools={"p": {"candidates": ["acme/a1", "cirrus/c1"]}},
                     dailyEstimatedUsd=5)  # fmt: skip
    try:
        assert routing.named_route(ledger, _request("acme/a1")) is not None  # the control
        assert routing.named_route(ledger, _request("pool/p")) is None
        assert routing.named_route(ledger, _request("acme/a1", key="k-1")) is None
        assert routing.named_route(ledger, _request("bolt/b1")) is None  # BOLT_KEY unset
        too_big = 4 * 100_000 * 4  # past a1's 100k-token window
        assert routing.named_route(ledger, _request("acme/a1", size=too_big)) is None
        other_format = _request("bolt/b1", fmt=Format.OPENAI, translatable=False)
        assert routing.named_route(ledger, other_format) is None
    finally:
        ledger.close()


def test_r_gw_2_r_sel_10_an_unpriced_model_under_a_cost_ceiling_selects_first(
    home: Path,
) -> None:
    catalog = gateway_catalog(UPSTREAM)  # type: ignore[arg-type]
    del catalog["models"][0]["pricing"]
    (home / "catalog.json").write_text(json.dumps(catalog))
    (home / "recovery.json").write_text(json.dumps({"dailyEstimatedUsd": 5}))
    ledger = Ledger.open(home, env={})
    try:
        assert routing.named_route(ledger, _request("acme/a1")) is None
    finally:
        ledger.close()


def test_r_gw_2_a_cooling_named_model_is_answered_by_the_selections_backup(
    ledger: Ledger, home: Path
) -> None:
    _rate_limit(ledger, "acme/a1")
    request = _request("acme/a1")
    selected = _first_route(ledger, request)
    assert routing.named_route(ledger, request) == "acme/a1"  # only the state says no
    answered, asked = _serve(ledger, request)
    assert selected != "acme/a1"
    assert asked == [selected]  # one upstream call, on the backup the selection names
    assert answered.attempt.number == 1
    assert answered.attempt.fallback_from == "acme/a1"
    assert answered.attempt.reservation.model == selected
    assert _reservations(home, "gw-s") == 1  # the refused reserve of a1 wrote nothing


def test_r_gw_2_a_refusal_no_route_escapes_is_the_reserves_own(home: Path) -> None:
    limited = _ledger(home, callsPerHour=1)
    try:
        first, asked = _serve(limited, _request("acme/a1", source="gw-1"))
        assert asked == ["acme/a1"]
        with pytest.raises(GatewayError) as refused:
            _serve(limited, _request("acme/a1", source="gw-2"))
    finally:
        limited.close()
    assert refused.value.status == 429
    assert refused.value.code == "shared_hourly_budget"
    assert refused.value.retry_after_s is not None
    assert refused.value.retry_after_s > 0
    assert first.attempt.fallback_from is None

