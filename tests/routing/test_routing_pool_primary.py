"""R-RT-5a: a requested `pool/NAME` makes its candidates the primary, whatever `defaultModel` and
`chains` say; a candidate requested alone is still held to the allowlist. `pool show`, `select`
and the reserve agree on every candidate, on SQLite and PostgreSQL, through the library, the CLI
and a real `ledger serve`."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.classify import classify_http
from ledger.cli.main import cli
from ledger.config import Policy
from ledger.errors import Refused
from ledger.kinds import AttemptRole, CooldownScope, ExclusionReason, FailureKind
from ledger.records import Failed
from ledger.standin.server import StandIn
from ledger.status.pools import pool_view_named
from ledger.store.pool_views import pool_state
from tests.support.backends import BACKENDS
from tests.support.gateway_setup import gateway
from tests.support.ledgers import Clock
from tests.support.routing_fixtures import RoutingFactory, routing_catalog, routing_ledger

__all__ = ["routing_ledger"]

HELLO: Any = [{"role": "user", "content": "hello"}]
# the shape: a concrete defaultModel with a chain, and a round-robin pool over it and a
# model its chain leaves out
MIX: dict[str, Any] = {"candidates": ["acct1/m", "acct2/m"], "strategy": "round-robin"}
POLICY: dict[str, Any] = {
    "defaultModel": "acct1/m",
    "chains": {"acct1/m": ["plain/p"]},
    "pools": {"mix": MIX},
}


def _even(counts: Counter[str], keys: Sequence[str]) -> bool:
    got = [counts.get(k, 0) for k in keys]
    return max(got) - min(got) <= 1 and sum(got) == sum(counts.values())


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_rt_5a_a_named_pool_spreads_round_robin_whatever_default_model_and_chains_say(
    routing_ledger: RoutingFactory,
) -> None:
    led = routing_ledger(**POLICY)
    got = [led.reserve(f"s{i}", "pool/mix", input_bytes=10).model for i in range(5)]
    assert got == ["acct1/m", "acct2/m", "acct1/m", "acct2/m", "acct1/m"]
    assert _even(Counter(got), MIX["candidates"])
    assert pool_state(led.db).cursors == {"mix": 0}
    led.reserve("s5", "pool/mix", input_bytes=10)
    assert pool_state(led.db).cursors == {"mix": 1}  # the cursor moves with every grant
    # a candidate requested alone is still held to defaultModel's chain (R-RT-1)
    with pytest.raises(Refused) as alone:
        led.reserve("alone", "acct2/m", input_bytes=10)
    assert alone.value.reason == "not_in_fallback_list"


def _invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def _json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_rt_5a_cli_pool_show_select_and_reserve_agree_and_the_cursor_moves(
    home: Path,
) -> None:
    (home / "catalog.json").write_text(json.dumps(routing_catalog()))
    (home / "recovery.json").write_text(json.dumps({**POLICY, "sourceModels": 10}))
    shown = _json(_invoke(home, "pool", "show", "mix", "--json"))
    assert [(c["model"], c["state"]) for c in shown["candidates"]] == [
        ("acct1/m", "eligible"), ("acct2/m", "eligible"),
    ]  # fmt: skip
    selected = _json(_invoke(home, "select", "c0", "--model", "pool/mix", "--json"))
    assert selected["routes"][0] == "pool/mix"
    cursors = []
    models = []
    for i in range(4):
        models.append(_json(_invoke(home, "reserve", f"c{i}", "--model", "pool/mix", "--json")))
        cursors.append(_json(_invoke(home, "pool", "show", "mix", "--json"))["cursor"])
    assert [m["model"] for m in models] == ["acct1/m", "acct2/m", "acct1/m", "acct2/m"]
    assert {m["pool"] for m in models} == {"mix"}
    assert cursors == [0, 1, 0, 1]
    alone = _invoke(home, "reserve", "alone", "--model", "acct2/m", "--json")
    assert alone.exit_code == 3
    assert json.loads(alone.output)["error"]["code"] == "not_in_fallback_list"


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_rt_5a_r_gw_2_the_gateway_spreads_a_named_pool_past_default_model_and_chains(
    home: Path,
) -> None:
    """`model: pool/mix` with a concrete defaultModel whose chain leaves out the pool's other
    candidate: before, every request went to acme/a1 and the cursor stayed at 0."""
    policy = {
        "defaultModel": "acme/a1",
        "chains": {"acme/a1": ["bolt/b1"]},
        "pools": {"mix": {"candidates": ["acme/a1", "cirrus/c1"], "strategy": "round-robin"}},
    }
    with StandIn() as standin, gateway(home, standin, **policy) as gw:
        client = gw.openai()
        answered = []
        for _ in range(5):
            raw = client.chat.completions.with_raw_response.create(
                model="pool/mix", messages=HELLO
            )
            answered.append(raw.parse().model)
            assert raw.headers["x-ledger-model"] == raw.parse().model
            assert "x-ledger-fallback-from" not in raw.headers
        asked = Counter(gw.models_asked())
        shown = _json(_invoke(home, "pool", "show", "mix", "--json"))
    assert answered == ["acme/a1", "cirrus/c1", "acme/a1", "cirrus/c1", "acme/a1"]
    assert asked == {"a1": 3, "c1": 2}
    assert shown["cursor"] == 0  # the fifth grant was the first candidate's


# ---------------------------------------------------------------- pool show / select / reserve

CANDIDATES = ["acct1/m", "acct2/m", "acct3/m", "claude/sonnet"]
DEFAULTS = [None, "acct1/m", "plain/p", "acct3/m:low", "pool/mix", "pool/other"]
CHAINS: list[dict[str, Any]] = [
    {},
    {"chains": {"acct1/m": ["plain/p"]}},
    {"chains": {"*": ["claude/sonnet"], "pool/*": ["plain/p"]}},
    {"defaultChain": ["acct4/m"]},
    {"chains": {"plain/*": ["acct2/m"]}, "defaultChain": ["plain/p"]},
]


@st.composite
def _policies(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    cands = draw(st.lists(st.sampled_from(CANDIDATES), min_size=1, max_size=4, unique=True))
    nested = draw(st.booleans())
    entries: list[Any] = list(cands)
    if nested:
        entries.append("pool/other")
    policy: dict[str, Any] = {
        "pools": {
            "mix": {"candidates": entries, "strategy": "round-robin"},
            "other": {"candidates": ["acct4/m", "plain/p"], "strategy": "primary"},
        },
        "crossProviderFallback": draw(st.booleans()),
        **draw(st.sampled_from(CHAINS)),
    }
    default = draw(st.sampled_from(DEFAULTS))
    if default is not None:
        policy["defaultModel"] = default
    if draw(st.booleans()):
        policy["routes"] = {"deny": [draw(st.sampled_from(["acct2/*", "claude/*", "plain/*"]))]}
    cooling = draw(st.lists(st.sampled_from(["acct1", "acct3", "acct4"]), max_size=2, unique=True))
    return policy, cooling


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=_policies())
def test_r_rt_5a_pool_show_select_and_reserve_agree_on_every_candidate(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[dict[str, Any], list[str]]
) -> None:
    """Whatever defaultModel, chains, crossProviderFallback, route rules and cooldowns say: the
    candidates `pool show` calls eligible are the ones `select` does, and reserving through the
    pool grants each of them in turn and never another one; with none eligible it is refused
    for a reason one of them shows."""
    policy, cooling = case
    home = tmp_path_factory.mktemp("agree")
    base = {"callsPerHour": 10_000, "sourceCalls": 1000, "sourceModels": 10}
    led = Ledger.open(
        home,
        policy=Policy.model_validate({**base, **policy}),
        catalog=Catalog.model_validate(routing_catalog()),
        env={},
        clock=Clock(),
        jitter=lambda: 0.0,
    )
    try:
        for provider in cooling:
            led.store.set_cooldown(CooldownScope.PROVIDER, provider, 3_600_000, None)
        shown = {c.key: c.state for c in pool_view_named(led, "mix").candidates}
        nested = {c.key: c.state for c in pool_view_named(led, "other").candidates}
        view = next(v for v in led.select(None, model="pool/mix").pools if v.name == "mix")
        assert {c.key: c.state for c in view.candidates} == shown
        eligible = set()
        for key, state in shown.items():
            if key == "pool/other":
                if state == "eligible":
                    eligible |= {k for k, s in nested.items() if s == "eligible"}
            elif state == "eligible":
                eligible.add(key)
        granted: Counter[str] = Counter()
        reasons: set[str] = set()
        for i in range(max(1, len(eligible)) * 2):
            try:
                granted[led.reserve(f"s{i}", "pool/mix", input_bytes=10).model] += 1
            except Refused as refused:
                reasons.add(refused.reason)
        assert not (eligible and reasons), (policy, cooling, shown, reasons)
        assert reasons <= {*shown.values(), *nested.values(), "no_pool_candidate"}
        assert set(granted) <= eligible, (policy, cooling, shown, granted)
        direct = {k for k in shown if k != "pool/other" and k in eligible}
        assert direct <= set(granted), (policy, cooling, shown, granted)
        if eligible:
            _backups_agree(led, policy)
    finally:
        led.close()


BOUNDARY = {ExclusionReason.NOT_IN_FALLBACK_LIST, ExclusionReason.DENIED_BY_ROUTE}


def _backups_agree(led: Ledger, policy: dict[str, Any]) -> None:
    """After a failed pool candidate, the follow-up reserve (`after=`) refuses every model
    select keeps out by the privacy boundary, for the same reason, and grants select's first
    backup: the pool's chain is the allowlist, whatever defaultModel says (R-RT-5a)."""
    first = led.reserve("f", "pool/mix", input_bytes=10)
    settled = led.settle(first.id, Failed(classify_http(429, {}, None, 0)))
    assert settled.fallback is not None
    selection = led.select(
        "f", model="pool/mix", after_failure=FailureKind.RATE_LIMIT, failed_model=first.model,
        tried=[first.model],
    )  # fmt: skip
    for exclusion in selection.excluded:
        if exclusion.reason in BOUNDARY:
            with pytest.raises(Refused) as refused:
                led.reserve("f", exclusion.model, input_bytes=10, after=first.id)
            assert refused.value.reason == exclusion.reason, (policy, exclusion)
    if selection.routes:
        backup = led.reserve("f", selection.routes[0], input_bytes=10, after=first.id)
        assert backup.role is AttemptRole.FALLBACK, (policy, selection.routes)
