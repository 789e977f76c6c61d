"""R-FMT-3: `POST /openai/v1/embeddings` through a real `ledger serve` and the stand-in, with the
official OpenAI SDK: reserved (input bound x input price, no reply allowance), settled with the
returned usage, chains of embedding models, never mixed with chat, refused under a spent scope
without reaching upstream; `GET /openai/v1/models` lists each model's kind."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from ledger.standin.server import Scripted, StandIn
from tests.support.embedding_setup import (
    E1_PRICE,
    embedding_catalog,
    embedding_gateway,
    reservation_rows,
)
from tests.support.gateway_keys import _ledger


def test_r_fmt_3_sdk_embeddings_create_reserves_the_input_bound_and_settles_exact(
    home: Path,
) -> None:
    with StandIn({"e1": [Scripted(input_tokens=7)]}) as standin, embedding_gateway(
        home, standin
    ) as gw:
        answer = gw.openai().embeddings.with_raw_response.create(
            model="acme/e1", input=["first text", "second text"]
        )
        result = answer.parse()
        sent = standin.bodies[-1]
    assert [d.index for d in result.data] == [0, 1]  # a batch: one call, one reservation
    assert len(result.data[0].embedding) == 8  # the SDK decoded the stand-in's base64 vectors
    assert result.model == "acme/e1"  # the model key that answered (R-GW-6)
    assert result.usage.prompt_tokens == 7
    assert answer.headers["x-ledger-model"] == "acme/e1"
    assert sent["model"] == "e1"
    assert sent["input"] == ["first text", "second text"]
    (row,) = reservation_rows(home)
    assert row["model_key"] == "acme/e1"
    assert row["status"] == "succeeded"
    # R-FMT-3: the estimate is the input bound at the input price, no reply allowance at all
    assert row["estimate_micro"] == row["input_bytes"] * E1_PRICE
    assert row["input_bytes"] >= len(json.dumps(sent, separators=(",", ":")))  # the whole body
    # settled with the returned usage: 7 tokens at 2 USD/MTok = 14 micro-USD
    assert (row["input_tokens"], row["output_tokens"]) == (7, 0)
    assert row["actual_micro"] == row["cost_micro"] == 7 * E1_PRICE


def test_r_fmt_3_a_chain_of_embedding_models_falls_back_and_never_to_chat(home: Path) -> None:
    failing = [Scripted(status=500), Scripted(status=500)]
    policy = {"chains": {"acme/e1": ["cirrus/e2"]}, "crossProviderFallback": True}
    with StandIn({"e1": failing}) as standin, embedding_gateway(home, standin, **policy) as gw:
        answer = gw.openai().embeddings.with_raw_response.create(model="acme/e1", input="x")
        asked = gw.models_asked()
    assert answer.headers["x-ledger-model"] == "cirrus/e2"
    assert answer.headers["x-ledger-fallback-from"] == "acme/e1"
    assert "a1" not in asked
    assert asked[-1] == "e2"
    assert all(r.path == "/v1/embeddings" for r in standin.requests)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/openai/v1/embeddings", {"model": "acme/a1", "input": "x"}),  # chat model, embeddings
        ("/openai/v1/chat/completions",  # embedding model, chat
         {"model": "acme/e1", "messages": [{"role": "user", "content": "x"}]}),
        ("/anthropic/v1/messages",
         {"model": "acme/e1", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}),
    ],
)
def test_r_fmt_3_a_request_never_lands_on_a_model_of_the_other_kind(
    home: Path, path: str, body: dict[str, object]
) -> None:
    with StandIn() as standin, embedding_gateway(home, standin) as gw:
        answer = httpx.post(gw.url + path, json=body, timeout=60,
                            headers={"authorization": f"Bearer {gw.token}"})  # fmt: skip
        received = standin.requests
    assert answer.status_code == 400
    document = answer.json()
    code = document["error"].get("code") or document["error"].get("type")
    assert code == "model_kind" or "model_kind" in document["error"]["message"], document
    assert received == []  # nothing reserved, nothing sent
    assert reservation_rows(home) == []


def test_r_fmt_3_embeddings_under_a_spent_scope_are_429_and_never_reach_upstream(
    home: Path,
) -> None:
    policy = {"scopes": {"memory": {"callsPerHour": 1}}}
    with StandIn() as standin, embedding_gateway(home, standin, **policy) as gw:
        made = _ledger(home, "key", "create", "learner", "--scope", "memory")
        assert made.returncode == 0, made.stderr
        client = openai.OpenAI(base_url=gw.url + "/openai/v1", api_key=made.stdout.strip(),
                               max_retries=0, timeout=60)  # fmt: skip
        gw.clients.append(client)
        client.embeddings.create(model="acme/e1", input="spends the scope's one call")
        with pytest.raises(openai.RateLimitError) as refused:
            client.embeddings.create(model="acme/e1", input="refused")
        received = len(standin.requests)
    assert refused.value.status_code == 429
    assert refused.value.body["code"] == "scope_hourly_budget"  # type: ignore[index]
    assert refused.value.response.headers.get("retry-after") is not None
    assert received == 1  # the refused one never reached upstream
    assert [r["status"] for r in reservation_rows(home)] == ["succeeded"]


def test_r_fmt_3_bad_embeddings_bodies_are_400_with_nothing_reserved(home: Path) -> None:
    bodies = [
        {"model": "acme/e1"},
        {"model": "acme/e1", "input": ""},
        {"model": "acme/e1", "input": []},
        {"model": "acme/e1", "input": [1, "x"]},
        {"input": "x"},
    ]
    with StandIn() as standin, embedding_gateway(home, standin) as gw:
        codes = [
            httpx.post(gw.url + "/openai/v1/embeddings", json=b, timeout=60,
                       headers={"authorization": f"Bearer {gw.token}"}).status_code
            for b in bodies
        ]
        received = standin.requests
    assert codes == [400] * len(bodies)
    assert received == []
    assert reservation_rows(home) == []


def test_r_fmt_3_models_list_names_each_models_kind(home: Path) -> None:
    policy = {"pools": {"vectors": {"candidates": ["acme/e1", "cirrus/e2"]}}}
    with StandIn() as standin, embedding_gateway(home, standin, **policy) as gw:
        listed = {m.id: m.model_extra["kind"] for m in gw.openai().models.list()}  # type: ignore[index]
        vectors = gw.openai().embeddings.create(model="pool/vectors", input="x")
    assert listed["acme/e1"] == listed["cirrus/e2"] == "embedding"
    assert listed["acme/a1"] == listed["bolt/b1"] == "chat"
    assert listed["pool/vectors"] == "embedding"
    assert vectors.model in ("acme/e1", "cirrus/e2")  # a pool of embedding models serves them


@pytest.mark.parametrize(
    ("policy", "path"),
    [({"chains": {"acme/e1": ["cirrus/e2", "acme/a1"]}}, "chains.<key 1>"),
     ({"pools": {"mixed": {"candidates": ["acme/e1", "bolt/b1"]}}}, "pools.<key 1>"),
     ({"defaultModel": "acme/a1", "defaultChain": ["cirrus/e2"]}, "defaultChain")],
)  # fmt: skip
def test_r_fmt_3_a_chain_or_pool_mixing_kinds_is_a_config_error(
    home: Path, policy: dict[str, object], path: str
) -> None:
    with StandIn() as standin:
        (home / "catalog.json").write_text(json.dumps(embedding_catalog(standin)))
    (home / "recovery.json").write_text(json.dumps(policy))
    checked = _ledger(home, "config", "validate")
    assert checked.returncode == 2
    assert f"{path}: chat and embedding models never serve each other's requests" in checked.stderr
    assert "acme" not in checked.stderr  # positions only, never a key (R-CFG-3)
