"""The routing examples of the docs (R-RT-1, R-RT-4) are loaded exactly as printed and behave as the
README says: the translated glob-chains example and the translated round-robin pool example."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy, parse_policy
from ledger.routing.chains import chain_for
from ledger.targets import Effort, Target
from tests.docs.pages import all_text


def example(name: str) -> Policy:
    """The JSON block after `<!-- routing-example: NAME -->`, parsed as recovery.json."""
    found = re.search(
        rf"<!-- routing-example: {re.escape(name)} -->\n```json\n(.*?)\n```", all_text(),
        re.S,
    )  # fmt: skip
    assert found is not None, name
    return parse_policy(found.group(1))


def test_r_rt_1_the_readme_glob_chains_example() -> None:
    pol = example("glob-chains")
    exact = chain_for(pol, "cline-pass/cline-pass/kimi-k3")
    assert (exact.key, exact.why) == ("cline-pass/cline-pass/kimi-k3", "exact key")
    assert exact.entries == (
        Target("neuralwatt/kimi-k3-flex", Effort.MAX),
        Target("cline-pass-gmail/cline-pass/kimi-k3", Effort.HIGH),
    )
    assert chain_for(pol, "cline-pass/cline-pass/glm-5.3-flash").key == "cline-pass/*"
    gmail = chain_for(pol, "cline-pass-gmail/cline-pass/glm-5.3-flash")
    assert gmail.key == "cline-pass-gmail/*"
    assert gmail.entries == (Target("neuralwatt/kimi-k3-flex", Effort.MAX),)
    other = chain_for(pol, "zai/glm-5.2")
    assert other.field == "defaultChain"
    assert other.entries == (Target("openrouter/fusion:xxs"),)  # not a level: part of the id


def _catalog() -> Catalog:
    models: list[dict[str, Any]] = [
        {"provider": p, "id": "glm-5.2", "reasoning": True, "contextWindow": 1_000_000,
         "maxOutputTokens": 128_000, "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}]}
        for p in ("k", "wg")
    ]  # fmt: skip
    providers = {p: {"available": True, "baseUrl": "http://127.0.0.1:9/v1"} for p in ("k", "wg")}
    return Catalog.model_validate({"providers": providers, "models": models})


def test_r_rt_5_the_readme_round_robin_pool_example(tmp_path: Path) -> None:
    pol = example("round-robin-pool")
    led = Ledger.open(tmp_path, policy=pol, catalog=_catalog(), env={})
    try:
        assert led.select("s0").routes == ("pool/default",)
        got = [led.reserve(f"s{i}", "pool/default", input_bytes=10) for i in range(4)]
    finally:
        led.close()
    assert [r.model for r in got] == ["k/glm-5.2", "wg/glm-5.2", "k/glm-5.2", "wg/glm-5.2"]
    assert {r.pool for r in got} == {"default"}
