"""A route's upstream facts are worked out once per Ledger (`upstream.route_facts`), while its
credential is still read from the environment for each request (R-GW-3, R-HTTP-2): a key rotated
in the environment is the next request's key, and a second Ledger on another catalog never gets
the first one's URL. In process, on real migrated SQLite files."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from ledger.api import Ledger
from ledger.gateway.formats import Format
from ledger.gateway.upstream import prepare, route_facts
from tests.support.gateway_setup import gateway_catalog

BODY = {"model": "bolt/b1", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}


def _open(home: Path, port: int, env: dict[str, str]) -> Ledger:
    home.mkdir(exist_ok=True)
    upstream = SimpleNamespace(
        base_url_openai=f"http://127.0.0.1:{port}/v1", base_url_anthropic=f"http://127.0.0.1:{port}"
    )
    (home / "catalog.json").write_text(json.dumps(gateway_catalog(upstream)))  # type: ignore[arg-type]
    (home / "recovery.json").write_text("{}")
    return Ledger.open(home, env=env)


def test_r_gw_3_credential_read_per_request_through_the_cached_route(tmp_path: Path) -> None:
    env = {"BOLT_KEY": "first-key"}
    ledger = _open(tmp_path / "a", 9, env)
    try:
        model = ledger.model("bolt/b1")
        first = prepare(ledger, model, Format.ANTHROPIC, BODY)
        env["BOLT_KEY"] = "rotated-key"  # the same environment, a new value
        second = prepare(ledger, model, Format.ANTHROPIC, BODY)
        del env["BOLT_KEY"]
        third = prepare(ledger, model, Format.ANTHROPIC, BODY)
        assert route_facts(ledger, model) is route_facts(ledger, model)  # worked out once
    finally:
        ledger.close()
    assert first.headers["x-api-key"] == "first-key"
    assert second.headers["x-api-key"] == "rotated-key"
    assert "x-api-key" not in third.headers
    # the cached headers themselves never hold a credential
    assert "x-api-key" not in route_facts(ledger, model).headers
    assert first.url == "http://127.0.0.1:9/v1/messages"


def test_r_gw_3_route_facts_belong_to_their_own_ledger(tmp_path: Path) -> None:
    one = _open(tmp_path / "one", 9, {})
    other = _open(tmp_path / "other", 10, {})
    other.close()
    # the same policy object (its memo) under another catalog: facts are never shared
    two = Ledger.open(tmp_path / "other", policy=one.policy, catalog=other.catalog, env={})
    try:
        a = prepare(one, one.model("acme/a1"), Format.OPENAI, {**BODY, "model": "acme/a1"})
        b = prepare(two, two.model("acme/a1"), Format.OPENAI, {**BODY, "model": "acme/a1"})
    finally:
        one.close()
        two.close()
    assert a.url == "http://127.0.0.1:9/v1/chat/completions"
    assert b.url == "http://127.0.0.1:10/v1/chat/completions"
    assert a.body["max_tokens"] == b.body["max_tokens"] == 10  # the caller's, within 4096
