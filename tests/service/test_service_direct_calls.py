"""R-SRV-2, R-SRV-6: reserve, settle and evolve answered straight from the gate
(`calls.DirectCalls`, past FastAPI's stack) answer byte for byte what FastAPI's path answers:
successes, domain errors through the same handler, bad bodies (left to FastAPI), and the
metrics' route labels."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from fastapi.routing import APIRoute

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.service import calls
from ledger.service.app import ServiceApp, create_app
from tests.support.ledgers import TEST_CATALOG, Clock

TOKEN = "service-token-for-the-test-0123"
AUTH = {"authorization": f"Bearer {TOKEN}"}
REQUESTS: list[tuple[str, bytes]] = [
    ("/v1/reserve", b'{"source": "s1", "model": "alpha/small", "input_bytes": 40}'),
    ("/v1/settle", b'{"reservation": 1, "outcome": {"result": "success", "input_tokens": 5, '
                   b'"output_tokens": 7}}'),
    ("/v1/settle", b'{"reservation": 1, "outcome": {"result": "cancelled"}}'),
    ("/v1/settle", b'{"reservation": 999, "outcome": {"result": "cancelled"}}'),
    ("/v1/reserve", b'{"source": "s2", "model": "alpha/nope"}'),
    ("/v1/evolve", b'{"source": "unknown-source", "model": "alpha/small"}'),
    ("/v1/evolve", b'{"source": "s1", "model": "alpha/big"}'),
    ("/v1/reserve", b'{"source": "s3", "model": "alpha/small"'),  # not JSON
    ("/v1/reserve", b'{"source": "s3", "model": "alpha/small", "colour": "red"}'),
    ("/v1/settle", b'{"reservation": "x", "outcome": {}}'),
    ("/v1/reserve", b""),
]


def _run(state: Path, clock: Clock, direct: bool) -> tuple[list[Any], str, int]:
    state.mkdir(mode=0o700)
    (state / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    ledger = Ledger.open(
        state, catalog=Catalog.model_validate(TEST_CATALOG), env={}, clock=clock,
        jitter=lambda: 0.0,
    )
    app = create_app(ledger, token=TOKEN)
    assert isinstance(app, ServiceApp)
    taken = 0
    inner = app.gate.direct
    assert inner is not None

    async def counting(*args: Any) -> bool:
        nonlocal taken
        answered: bool = await inner(*args)
        taken += answered
        return answered

    app.gate.direct = counting if direct else None  # type: ignore[assignment]

    async def go() -> list[Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            seen = []
            for path, body in REQUESTS:
                answer = await c.post(path, content=body, headers=AUTH)
                headers = answer.headers.multi_items()
                seen.append((path, answer.status_code, headers, answer.content))
            return seen

    try:
        seen = asyncio.run(go())
        counted = "\n".join(
            line for line in app.state.metrics.exposition().splitlines()
            if line.startswith("ledger_http_requests_total")
        )
    finally:
        app.state.group.close()
        ledger.close()
    return seen, counted, taken


def test_r_srv_2_direct_calls_answer_as_fastapi_does(tmp_path: Path) -> None:
    direct, direct_counts, taken = _run(tmp_path / "direct", Clock(), direct=True)
    stack, stack_counts, _ = _run(tmp_path / "stack", Clock(), direct=False)
    assert taken == 7  # the valid bodies were answered directly (the others went on to FastAPI)
    assert [s for _, s, _, _ in direct] == [200, 200, 400, 404, 400, 404, 200, 400, 422, 422, 422]
    assert direct == stack
    assert direct_counts == stack_counts
    assert 'route="/v1/reserve"' in direct_counts
    assert 'route="/v1/settle"' in direct_counts


def test_r_srv_2_direct_calls_cover_their_routes() -> None:
    """Every direct route is the router's own, for POST (a renamed route fails at start)."""
    routes = [r for r in calls.router.routes if isinstance(r, APIRoute)]
    paths = {r.path for r in routes if "POST" in (r.methods or ())}
    assert set(calls.DIRECT) <= paths
