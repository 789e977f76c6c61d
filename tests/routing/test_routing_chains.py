"""Chains and targets (R-RT-1, R-RT-2): resolution by a table of cases, cascading without
duplicates, every existing exclusion still applied to chain entries, config errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ledger.catalog import Catalog
from ledger.config import Policy, parse_policy
from ledger.errors import ConfigError
from ledger.kinds import CooldownOrigin, CooldownScope, ExclusionReason, FailureKind
from ledger.routing.chains import cascade, chain_for
from ledger.routing.select import CooldownView, Route, SelectionRequest, Snapshot, select
from ledger.targets import Effort, Target, parse_target

R = ExclusionReason
NOW = 1_700_000_000_000


def policy(**doc: Any) -> Policy:
    return parse_policy(json.dumps(doc))


def price(inp: float, out: float) -> list[dict[str, Any]]:
    return [{"inputUsdPerMTok": inp, "outputUsdPerMTok": out}]


MODELS: list[dict[str, Any]] = [
    {"provider": "openai", "id": "gpt-5", "pricing": price(1, 8), "reasoning": True},
    {"provider": "openai", "id": "gpt-5-mini", "pricing": price(0.2, 1)},
    {"provider": "anthropic", "id": "claude-sonnet-4-5", "pricing": price(3, 15),
     "reasoning": True},
    {"provider": "anthropic", "id": "claude-haiku-4-5", "pricing": price(1, 5)},
    {"provider": "google", "id": "gemini-2.5-pro", "pricing": price(1.25, 10)},
    {"provider": "deepseek", "id": "deepseek-chat", "pricing": price(0.3, 1.2),
     "contextWindow": 1000, "maxOutputTokens": 500},
    {"provider": "mistral", "id": "mistral-large", "pricing": price(2, 6)},
]  # fmt: skip
CATALOG = Catalog.model_validate(
    {
        "providers": {
            m["provider"]: {"available": True, "baseUrl": "http://127.0.0.1:9/v1"} for m in MODELS
        },
        "models": MODELS,
    }
)
AVAILABLE = frozenset(m["provider"] for m in MODELS)

CHAINS: dict[str, Any] = {
    "*": ["mistral/mistral-large"],
    "openai/*": ["google/gemini-2.5-pro"],
    "openai/gpt-5*": ["anthropic/claude-sonnet-4-5"],
    "openai/gpt-?-mini": ["deepseek/deepseek-chat"],
    "openai/gpt-5-mini": ["anthropic/claude-haiku-4-5"],
    "anthropic/claude-*-4-5": ["openai/gpt-5"],
    "anthropic/*-4-5": ["google/gemini-2.5-pro"],
}


@pytest.mark.parametrize(
    ("primary", "chains", "default_chain", "field", "key", "why"),
    [
        # exact key wins over every glob, even a more literal one written earlier
        ("openai/gpt-5-mini", CHAINS, None, "chains", "openai/gpt-5-mini", "exact key"),
        # most literal characters: `openai/gpt-5*` (12) beats `openai/*` (7) and `*` (0)
        ("openai/gpt-5", CHAINS, None, "chains", "openai/gpt-5*", "most literal characters (12)"),
        # `?` is a wildcard, not a literal: `openai/gpt-?-mini` has 16 literal characters
        ("openai/gpt-4-mini", CHAINS, None, "chains", "openai/gpt-?-mini",
         "most literal characters (16)"),
        # a tie (15 and 15): the earlier key
        ("anthropic/claude-x-4-5", {"anthropic/claude-*-4-5": ["openai/gpt-5"],
                                    "anthropic/*claude-4-5": ["google/gemini-2.5-pro"],
                                    "anthropic/c*-x-4-5": ["mistral/mistral-large"]},
         None, "chains", "anthropic/claude-*-4-5",
         "most literal characters (21)"),
        ("anthropic/claude-x-4-5", {"anthropic/clau*-x-4-5": ["openai/gpt-5"],
                                    "anthropic/claude-x*-5": ["google/gemini-2.5-pro"]},
         None, "chains", "anthropic/clau*-x-4-5",
         "most literal characters (20); the earlier of equally literal keys"),
        # anchored: `openai/*` does not match `xopenai/...`; only `*` does
        ("mistral/mistral-large", CHAINS, None, "chains", "*", "most literal characters (0)"),
        # nothing matches: defaultChain
        ("google/gemini-2.5-pro", {"openai/*": ["mistral/mistral-large"]},
         ["anthropic/claude-haiku-4-5"], "defaultChain", None, "no chains key matched"),
        # no chains at all and no default list: price order
        ("google/gemini-2.5-pro", {}, None, None, None,
         "no chain: backups in price order (R-SEL-6)"),
    ],
)  # fmt: skip
def test_r_rt_1_chain_resolution_table(
    primary: str,
    chains: dict[str, Any],
    default_chain: list[str] | None,
    field: str | None,
    key: str | None,
    why: str,
) -> None:
    doc: dict[str, Any] = {"chains": chains}
    if default_chain is not None:
        doc["defaultChain"] = default_chain
    match = chain_for(policy(**doc), primary)
    assert (match.field, match.key, match.why) == (field, key, why)


def test_r_rt_1_fallback_models_means_default_chain() -> None:
    pol = policy(fallbackModels=["google/gemini-2.5-pro", "mistral/mistral-large"])
    match = chain_for(pol, "openai/gpt-5")
    assert match.field == "fallbackModels"
    assert [t.key for t in match.entries] == ["google/gemini-2.5-pro", "mistral/mistral-large"]
    same = chain_for(policy(defaultChain=["google/gemini-2.5-pro", "mistral/mistral-large"]),
                     "openai/gpt-5")  # fmt: skip
    assert same.entries == match.entries


def test_r_rt_1_both_fallback_models_and_default_chain_is_a_config_error() -> None:
    doc = {"fallbackModels": ["openai/gpt-5"], "defaultChain": ["sk-secret/very-secret-value"]}
    with pytest.raises(ConfigError) as err:
        parse_policy(json.dumps(doc))
    assert err.value.path == "defaultChain"
    assert "secret" not in str(err.value)


@pytest.mark.parametrize(
    ("doc", "path", "rule"),
    [
        ({"chains": {"openai/*": ["pool/nope"]}}, "chains.<key>[0]", "names a pool"),
        ({"defaultModel": "pool/nope"}, "defaultModel", "names a pool"),
        ({"chains": {"openai/*": ["google/g", {"model": "google/g", "effort": "low"}]}},
         "chains.<key>", "duplicate"),
        ({"chains": {"x/*": [{"model": "google/g:high", "effort": "low"}]}},
         "chains.<key>[0]", "either"),
        ({"chains": {"x/*": [{"model": "google/g", "effort": "huge"}]}},
         "chains.<key>[0].effort", "allowed values"),
        ({"pools": {"a": {"candidates": ["pool/b"]}, "b": {"candidates": ["pool/a"]}}},
         "pools.<key>.candidates", "cycle"),
        ({"pools": {"a": {"candidates": ["x/y"], "strategy": "fastest"}}},
         "pools.<key>.strategy", "allowed values"),
        ({"pools": {"a": {"candidates": ["x/y"], "sticky": {"for": "soon"}}}},
         "pools.<key>.sticky.for", "duration"),
    ],
)  # fmt: skip
def test_r_rt_4_routing_config_errors_name_the_path_never_the_value(
    doc: dict[str, Any], path: str, rule: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_policy(json.dumps(doc))
    assert err.value.path.startswith(path.split(".")[0])
    assert path in err.value.path or err.value.path in path
    assert rule in err.value.rule


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("openai/gpt-5:high", Target("openai/gpt-5", Effort.HIGH)),
        ("openai/gpt-5:none", Target("openai/gpt-5", Effort.NONE)),
        ("openrouter/fusion:xxs", Target("openrouter/fusion:xxs")),  # not a level: part of the id
        ("openai/gpt-5", Target("openai/gpt-5")),
        ("pool/fast:low", Target("pool/fast", Effort.LOW)),
        ("ollama/llama3:8b:max", Target("ollama/llama3:8b", Effort.MAX)),
    ],
)
def test_r_rt_2_level_suffix_only_for_the_listed_levels(text: str, target: Target) -> None:
    assert parse_target(text) == target


def test_r_rt_1_cascading_appends_the_failed_backups_chain_without_duplicates() -> None:
    pol = policy(
        chains={
            "openai/gpt-5": ["anthropic/claude-sonnet-4-5", "google/gemini-2.5-pro"],
            "anthropic/*": ["mistral/mistral-large", "google/gemini-2.5-pro", "openai/gpt-5"],
        }
    )
    _, before = cascade(pol, "openai/gpt-5", [])
    assert [t.key for t in before] == ["anthropic/claude-sonnet-4-5", "google/gemini-2.5-pro"]
    _, after = cascade(pol, "openai/gpt-5", ["openai/gpt-5", "anthropic/claude-sonnet-4-5"])
    assert [t.key for t in after] == [
        "anthropic/claude-sonnet-4-5",
        "google/gemini-2.5-pro",  # not yet tried: keeps its place
        "mistral/mistral-large",  # the backup's own chain, behind, without duplicates
    ]


def snap(**kw: Any) -> Snapshot:
    base: dict[str, Any] = {"now_ms": NOW, "available_providers": AVAILABLE, "cooldowns": ()}
    return Snapshot(**{**base, **kw})


def run(pol: Policy, snapshot: Snapshot | None = None, **kw: Any) -> Any:
    return select(CATALOG, pol, snapshot or snap(), SelectionRequest(**kw))


def test_r_rt_1_chain_is_the_complete_backup_list_in_its_order() -> None:
    pol = policy(chains={"openai/gpt-5*": ["mistral/mistral-large", "google/gemini-2.5-pro"]})
    sel = run(pol, default_model="openai/gpt-5")
    assert sel.routes == ("openai/gpt-5", "mistral/mistral-large", "google/gemini-2.5-pro")
    reasons = {e.model: e.reason for e in sel.excluded}
    assert reasons["anthropic/claude-haiku-4-5"] == R.NOT_IN_FALLBACK_LIST
    assert sel.chain is not None
    assert sel.chain.key == "openai/gpt-5*"
    doc = sel.to_json()
    assert doc["chain"]["key"] == "openai/gpt-5*"
    assert doc["chain"]["why"] == "most literal characters (12)"


def test_r_rt_1_cascade_in_selection_after_a_backup_fails() -> None:
    pol = policy(
        chains={
            "openai/gpt-5": ["anthropic/claude-sonnet-4-5", "google/gemini-2.5-pro"],
            "anthropic/*": ["mistral/mistral-large"],
        }
    )
    sel = run(
        pol,
        default_model="openai/gpt-5",
        after_failure=FailureKind.TRANSPORT,
        failed_model="anthropic/claude-sonnet-4-5",
        tried=frozenset({"openai/gpt-5"}),
    )
    assert sel.routes == ("google/gemini-2.5-pro", "mistral/mistral-large")


@pytest.mark.parametrize(
    ("chain", "request_kw", "snap_kw", "model", "reason"),
    [
        # R-SEL-4: a sibling in the chain, after auth: never
        (["openai/gpt-5-mini"], {"after_failure": FailureKind.AUTH,
                                 "failed_model": "openai/gpt-5"}, {},
         "openai/gpt-5-mini", R.SIBLING_NOT_FOR_KIND),
        # after quota: never
        (["openai/gpt-5-mini"], {"after_failure": FailureKind.QUOTA,
                                 "failed_model": "openai/gpt-5"}, {},
         "openai/gpt-5-mini", R.SIBLING_NOT_FOR_KIND),
        # cooldowns still apply
        (["google/gemini-2.5-pro"], {}, {"cooldowns": (CooldownView(
            CooldownScope.PROVIDER, "google", NOW + 60_000, "auth", CooldownOrigin.POLICY),)},
         "google/gemini-2.5-pro", R.PROVIDER_COOLDOWN),
        # probes still apply
        (["google/gemini-2.5-pro"], {}, {"probing": (CooldownView(
            CooldownScope.MODEL, "google/gemini-2.5-pro", NOW + 60_000, "x",
            CooldownOrigin.POLICY),)},
         "google/gemini-2.5-pro", R.PROBING),
        # caps: sourceModels (2) already used by the source
        (["google/gemini-2.5-pro"], {}, {"source_models": frozenset(
            {"openai/gpt-5", "mistral/mistral-large"})},
         "google/gemini-2.5-pro", R.SOURCE_MODELS),
        # context fit
        (["deepseek/deepseek-chat"], {"input_tokens": 900}, {},
         "deepseek/deepseek-chat", R.CONTEXT_TOO_SMALL),
        # already tried
        (["google/gemini-2.5-pro"], {"tried": frozenset({"google/gemini-2.5-pro"})}, {},
         "google/gemini-2.5-pro", R.ALREADY_TRIED),
    ],
)  # fmt: skip
def test_r_rt_1_every_existing_exclusion_applies_to_chain_entries(
    chain: list[str],
    request_kw: dict[str, Any],
    snap_kw: dict[str, Any],
    model: str,
    reason: ExclusionReason,
) -> None:
    pol = policy(chains={"openai/gpt-5": chain})
    sel = run(pol, snap(**snap_kw), default_model="openai/gpt-5", **request_kw)
    assert model not in sel.routes
    assert {e.model: e.reason for e in sel.excluded}[model] == reason


def test_r_rt_1_route_rules_apply_to_chain_entries() -> None:
    pol = policy(
        chains={"openai/gpt-5": ["google/gemini-2.5-pro", "mistral/mistral-large"]},
        routes={"deny": ["google/*"]},
    )
    sel = run(pol, default_model="openai/gpt-5")
    assert sel.routes == ("openai/gpt-5", "mistral/mistral-large")
    assert {e.model: e.reason for e in sel.excluded}["google/gemini-2.5-pro"] == R.DENIED_BY_ROUTE


def test_r_rt_2_effort_belongs_to_its_route_only() -> None:
    pol = policy(
        chains={"openai/gpt-5": [{"model": "anthropic/claude-sonnet-4-5", "effort": "high"},
                                 "google/gemini-2.5-pro"]},
    )  # fmt: skip
    sel = run(pol, default_model="openai/gpt-5", default_effort=Effort.LOW)
    routes = sel.routes
    assert all(isinstance(r, Route) for r in routes)
    efforts = {str(r): r.effort for r in routes if isinstance(r, Route)}
    assert efforts == {
        "openai/gpt-5": Effort.LOW,
        "anthropic/claude-sonnet-4-5": Effort.HIGH,
        "google/gemini-2.5-pro": None,  # never the primary's effort
    }
    assert sel.to_json()["targets"][1] == {
        "route": "anthropic/claude-sonnet-4-5", "effort": "high", "pool": None,
    }  # fmt: skip


def test_r_rt_1_ledger_select_names_the_chain_that_matched(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from ledger.cli.main import cli
    from tests.support.ledgers import TEST_CATALOG

    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    doc = {"chains": {"alpha/*": ["beta/mid"],
                      "alpha/s*": [{"model": "alpha/big", "effort": "high"}]}}  # fmt: skip
    (home / "recovery.json").write_text(json.dumps(doc))
    text = CliRunner().invoke(cli, ["--home", str(home), "select", "s1", "--model", "alpha/small"])
    assert text.exit_code == 0, text.output
    assert "chain: chains[alpha/s*] (most literal characters (7))" in text.output
    assert "2. alpha/big  (effort high)" in text.output
    out = CliRunner().invoke(
        cli, ["--home", str(home), "select", "s1", "--model", "alpha/big", "--json"]
    )
    data = json.loads(out.output)
    assert data["chain"] == {
        "field": "chains", "key": "alpha/*", "why": "most literal characters (6)",
        "entries": ["beta/mid"],
    }  # fmt: skip
    assert data["routes"] == ["alpha/big", "beta/mid"]
