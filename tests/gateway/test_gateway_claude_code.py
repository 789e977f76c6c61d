"""R-FMT-4 through a real `ledger serve` and the stand-in, with the official Anthropic SDK:
`?beta=true`, `anthropic-beta` forwarded only as the catalog's `betas` allow and every drop named
in `x-ledger-dropped`, `messages.count_tokens` forwarded unreserved or 501, thinking blocks and
signatures untouched on same-format routes, thinking as reasoning effort on OpenAI routes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

from ledger.standin.extra import count_of
from ledger.standin.server import Scripted, StandIn
from tests.support.embedding_setup import ALLOWED_BETA, embedding_gateway, reservation_rows

OTHER_BETA = "context-management-2025-06-27"
USER = [{"role": "user", "content": "hello"}]
SIGNATURE = "c2lnbmVkIGJ5IGFudGhyb3BpYw=="
THINKING = {"type": "thinking", "thinking": "let me see", "signature": SIGNATURE}


def _create(client: anthropic.Anthropic, model: str, **extra: Any) -> Any:
    return client.beta.messages.with_raw_response.create(  # as Claude Code asks: ?beta=true
        model=model, max_tokens=extra.pop("max_tokens", 256), messages=extra.pop("messages", USER),
        betas=[ALLOWED_BETA, OTHER_BETA], extra_query={"beta": "true"}, **extra,
    )  # fmt: skip


def test_r_fmt_4_betas_forwarded_as_the_provider_allows_and_drops_reported(home: Path) -> None:
    with StandIn() as standin, embedding_gateway(home, standin) as gw:
        client = gw.anthropic()
        allowed = _create(client, "bolt/b1")  # bolt allows ALLOWED_BETA only
        closed = _create(client, "delta/d1")  # delta allows none
        sent = [r.headers.get("anthropic-beta") for r in standin.requests]
        paths = [r.path for r in standin.requests]
    assert allowed.http_request.url.params.get("beta") == "true"
    assert sent == [ALLOWED_BETA, None]
    assert paths == ["/v1/messages", "/v1/messages"]
    assert allowed.headers["x-ledger-dropped"] == f"anthropic-beta:{OTHER_BETA}"
    assert closed.headers["x-ledger-dropped"] == (
        f"anthropic-beta:{ALLOWED_BETA},anthropic-beta:{OTHER_BETA}"
    )


def test_r_fmt_4_openai_route_drops_hints_maps_thinking_to_effort(home: Path) -> None:
    system = [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]
    with StandIn() as standin, embedding_gateway(home, standin) as gw:
        answer = _create(
            gw.anthropic(), "acme/r1", system=system, max_tokens=4000,
            thinking={"type": "enabled", "budget_tokens": 3000},
            metadata={"user_id": "someone"},
        )  # fmt: skip
        message = answer.parse()
        (body,) = standin.bodies
    assert message.content[0].text == '{"ok": true}'
    assert body["reasoning_effort"] == "medium"  # 2048 <= budget < 8192 (R-FMT-4's table)
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert "metadata" not in body
    assert "thinking" not in body
    dropped = answer.headers["x-ledger-dropped"].split(",")
    assert set(dropped) == {
        "cache_control", "metadata",
        f"anthropic-beta:{ALLOWED_BETA}", f"anthropic-beta:{OTHER_BETA}",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("budget", "effort"), [(1024, "low"), (2047, "low"), (2048, "medium"), (8192, "high")]
)
def test_r_fmt_4_thinking_budget_table(budget: int, effort: str) -> None:
    from ledger.gateway.formats.anthropic_hints import effort_of  # lazy: one pure check

    assert effort_of({"thinking": {"type": "enabled", "budget_tokens": budget}}) == effort
    adaptive = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}
    assert effort_of(adaptive) == "low"
    assert effort_of({"thinking": {"type": "disabled"}}) is None


def test_r_fmt_4_thinking_blocks_and_signatures_pass_unmodified_on_anthropic_routes(
    home: Path,
) -> None:
    reply = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "b1",
        "content": [THINKING, {"type": "text", "text": "done"}],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 9},
    }  # fmt: skip
    history = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [THINKING, {"type": "text", "text": "answer"}]},
        {"role": "user", "content": "second"},
    ]
    scripted = Scripted(raw_body=json.dumps(reply).encode())
    with StandIn({"b1": [scripted]}) as standin, embedding_gateway(home, standin) as gw:
        answer = gw.anthropic().messages.with_raw_response.create(  # type: ignore[call-overload]
            model="bolt/b1", max_tokens=2048, messages=history,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
        raw = answer.http_response.json()
        (body,) = standin.bodies
    assert body["messages"][1]["content"][0] == THINKING  # the signed block went upstream as is
    assert raw["content"][0] == THINKING  # and came back as is
    assert "x-ledger-dropped" not in answer.headers


def test_r_fmt_4_count_tokens_is_forwarded_unreserved_to_an_anthropic_route(home: Path) -> None:
    with StandIn() as standin, embedding_gateway(home, standin) as gw:
        counted = gw.anthropic().messages.count_tokens(model="bolt/b1", messages=USER)  # type: ignore[arg-type]
        (request,) = standin.requests
        (body,) = standin.bodies
    assert request.path == "/v1/messages/count_tokens"
    assert body["model"] == "b1"
    assert counted.input_tokens == count_of(body)  # the route's count, not a made-up one
    assert reservation_rows(home) == []  # not a reservation: no budget counts it


def test_r_fmt_4_count_tokens_where_no_route_can_count_is_501(home: Path) -> None:
    with StandIn() as standin, embedding_gateway(
        home, standin, crossProviderFallback=False
    ) as gw:
        with pytest.raises(anthropic.APIStatusError) as failed:
            gw.anthropic().messages.count_tokens(model="acme/a1", messages=USER)  # type: ignore[arg-type]
        received = standin.requests
    assert failed.value.status_code == 501
    assert failed.value.body["error"]["code"] == "not_supported"  # type: ignore[index]
    assert received == []


def test_r_fmt_4_count_tokens_on_a_cooling_route_is_refused_not_sent(home: Path) -> None:
    limited = Scripted(status=429, retry_after="600")
    policy = {"crossProviderFallback": False}
    with StandIn({"b1": [limited, limited]}) as standin, embedding_gateway(
        home, standin, **policy
    ) as gw:
        client = gw.anthropic()
        with pytest.raises(anthropic.RateLimitError):
            client.messages.create(model="bolt/b1", max_tokens=64, messages=USER)  # type: ignore[arg-type]
        sent_before = len(standin.requests)
        with pytest.raises(anthropic.RateLimitError) as refused:
            client.messages.count_tokens(model="bolt/b1", messages=USER)  # type: ignore[arg-type]
        sent_after = len(standin.requests)
    assert refused.value.response.headers.get("retry-after") is not None
    assert refused.value.body["error"]["code"] in ("provider_cooldown", "model_cooldown")  # type: ignore[index]
    assert sent_after == sent_before  # the cooling route's cooldown applies: nothing sent


def test_r_fmt_4_a_streamed_answer_reports_its_drops_too(home: Path) -> None:
    with (
        StandIn() as standin,
        embedding_gateway(home, standin) as gw,
        gw.anthropic().beta.messages.with_streaming_response.create(
            model="delta/d1", max_tokens=64, messages=USER, stream=True,  # type: ignore[arg-type]
            betas=[ALLOWED_BETA], extra_query={"beta": "true"},
        ) as answer,
    ):  # fmt: skip
        dropped = answer.headers.get("x-ledger-dropped")
        body = b"".join(answer.iter_bytes())
    assert dropped == f"anthropic-beta:{ALLOWED_BETA}"
    assert b"message_stop" in body
