"""R-RT-5a: the backups after a failed candidate of a requested `pool/NAME` are held to the pool's
own chain (R-RT-1), not to defaultModel's: `select` offers them and the follow-up reserve
(`after=`) grants them, on SQLite and PostgreSQL, through the library and a real `ledger serve`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ledger.classify import classify_http
from ledger.errors import Refused
from ledger.kinds import AttemptRole, ExclusionReason, FailureKind
from ledger.records import Failed
from ledger.standin.server import Scripted, StandIn
from tests.support.backends import BACKENDS
from tests.support.gateway_setup import gateway
from tests.support.routing_fixtures import RoutingFactory, routing_ledger

__all__ = ["routing_ledger"]

HELLO: Any = [{"role": "user", "content": "hello"}]
# a concrete defaultModel whose chain is plain/p, and a pool whose own chain is acct3/m
POLICY: dict[str, Any] = {
    "defaultModel": "acct1/m",
    "chains": {"acct1/m": ["plain/p"], "pool/mix": ["acct3/m"]},
    "pools": {"mix": {"candidates": ["acct1/m"], "strategy": "round-robin"}},
}
RATE_LIMITED = Failed(classify_http(429, {}, None, 0))  # the model cools; a fallback is permitted


def _reason(selection: Any, key: str) -> str | None:
    return next((str(e.reason) for e in selection.excluded if e.model == key), None)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_rt_5a_a_backup_after_a_failed_pool_candidate_is_held_to_the_pools_chain(
    routing_ledger: RoutingFactory,
) -> None:
    """Before, select offered acct3/m after the pool's failed candidate, but its reserve was
    held to defaultModel's chain and refused it `not_in_fallback_list`."""
    led = routing_ledger(**POLICY)
    failed = {source: led.reserve(source, "pool/mix", input_bytes=10) for source in ("s1", "s2")}
    for first in failed.values():  # both reserved before the first failure cools acct1/m
        assert (first.model, first.pool, first.role) == ("acct1/m", "mix", AttemptRole.PRIMARY)
        assert led.settle(first.id, RATE_LIMITED).fallback is not None
    selection = led.select(
        "s1", model="pool/mix", after_failure=FailureKind.RATE_LIMIT, failed_model="acct1/m",
        tried=["pool/mix", "acct1/m"],
    )  # fmt: skip
    assert list(selection.routes) == ["acct3/m"]
    assert _reason(selection, "plain/p") == ExclusionReason.NOT_IN_FALLBACK_LIST
    backup = led.reserve("s1", selection.routes[0], input_bytes=10, after=failed["s1"].id)
    assert (backup.model, backup.role, backup.pool) == ("acct3/m", AttemptRole.FALLBACK, None)
    # defaultModel's backup is not one of the pool's: refused as select excludes it
    with pytest.raises(Refused) as outside:
        led.reserve("s2", "plain/p", input_bytes=10, after=failed["s2"].id)
    assert outside.value.reason == ExclusionReason.NOT_IN_FALLBACK_LIST
    # a candidate requested alone is still held to defaultModel's chain (R-RT-1)
    with pytest.raises(Refused) as alone:
        led.reserve("alone", "acct3/m", input_bytes=10)
    assert alone.value.reason == ExclusionReason.NOT_IN_FALLBACK_LIST


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_rt_5a_a_pool_a_follow_up_reaches_as_a_backup_is_not_its_primary(
    routing_ledger: RoutingFactory,
) -> None:
    """defaultModel's chain names the pool: after defaultModel fails, the pool is a backup like
    any other, confined as select confines it (crossProviderFallback off: the source keeps to its
    primary), never the follow-up's primary."""
    led = routing_ledger(
        defaultModel="acct1/m",
        crossProviderFallback=False,
        chains={"acct1/m": ["pool/mix"]},
        pools={"mix": {"candidates": ["acct2/m"]}},
    )
    first = led.reserve("s1", "acct1/m", input_bytes=10)
    assert led.settle(first.id, RATE_LIMITED).fallback is not None
    selection = led.select(
        "s1", after_failure=FailureKind.RATE_LIMIT, failed_model="acct1/m", tried=["acct1/m"]
    )
    assert list(selection.routes) == []
    with pytest.raises(Refused) as confined:
        led.reserve("s1", "pool/mix", input_bytes=10, after=first.id)
    assert confined.value.reason == ExclusionReason.NOT_IN_FALLBACK_LIST


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_rt_5a_r_gw_4_the_gateway_answers_from_the_pools_chain_after_its_candidates_fail(
    home: Path,
) -> None:
    """`model: pool/mix` whose candidates both fail (429): the gateway's third attempt is the
    pool's own chain (delta/d1), not defaultModel's (bolt/b1). Before, its reserve was refused
    `not_in_fallback_list` and the caller got the refusal."""
    policy = {
        "sourceModels": 3,  # both candidates and the backup
        "defaultModel": "acme/a1",
        "chains": {"acme/a1": ["bolt/b1"], "pool/mix": ["delta/d1"]},
        "pools": {"mix": {"candidates": ["acme/a1", "cirrus/c1"], "strategy": "round-robin"}},
    }
    limited = [Scripted(status=429)]
    script = {"a1": limited, "c1": limited}
    with StandIn(script) as standin, gateway(home, standin, **policy) as gw:
        raw = gw.openai().chat.completions.with_raw_response.create(
            model="pool/mix", messages=HELLO
        )
        answer = raw.parse()
        asked = Counter(gw.models_asked())
    assert answer.model == "delta/d1"
    assert raw.headers["x-ledger-model"] == "delta/d1"
    assert asked == {"a1": 1, "c1": 1, "d1": 1}
    assert "b1" not in asked
    assert json.loads(answer.choices[0].message.content or "null") == {"ok": True}
