"""What the reply allowance makes of a caller's output fields (R-GW-3 with the reservation's
estimate, R-RES): OpenAI's `n` choices share the one allowance the reservation covers, so many
choices never buy more output than the estimate; an Anthropic caller's thinking budget stays
inside the max_tokens sent, as Anthropic requires; a request the allowance cannot serve is
refused before anything is reserved or sent. Against a real `ledger serve` and the stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger.api import Ledger
from ledger.gateway.formats import Format, Limits
from ledger.standin.server import StandIn
from tests.support.gateway_setup import gateway

HELLO: Any = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("n", "asked", "sent"),
    [(None, None, 4096), (1, None, 4096), (4, None, 1024), (3, None, 1365), (4, 100, 100),
     (4, 5000, 1024), (128, None, 32)],
)
def test_r_gw_3_choices_share_the_reply_allowance(n: int | None, asked: int | None,
                                                  sent: int) -> None:  # fmt: skip
    body: dict[str, Any] = {"model": "acme/a1", "messages": HELLO}
    if n is not None:
        body["n"] = n
    if asked is not None:
        body["max_tokens"] = asked
    out = Format.OPENAI.upstream_body(body, Limits("a1", 4096, "max_tokens"))
    assert out["max_tokens"] == sent
    assert out.get("n") == n  # passed through as asked
    assert out["max_tokens"] * (n or 1) <= 4096  # all choices inside the estimate's allowance


@pytest.mark.parametrize("n", [0, -1, 129, "2", 2.0, True, None])
def test_r_gw_3_n_must_be_an_integer_from_1_to_128(n: object) -> None:
    problem = Format.OPENAI.check({"model": "m", "messages": HELLO, "n": n})
    if n is None:
        assert problem is None
    else:
        assert problem == "`n` must be an integer from 1 to 128"


def test_r_gw_3_the_stand_in_gets_each_choice_its_part(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        answer = httpx.post(gw.url + "/openai/v1/chat/completions", timeout=30,
                            headers={"authorization": f"Bearer {gw.token}"},
                            json={"model": "acme/a1", "messages": HELLO, "n": 4})  # fmt: skip
        assert answer.status_code == 200
        sent = standin.bodies[0]
    assert sent["n"] == 4
    assert sent["max_tokens"] == 1024  # 4096 / 4


def test_r_gw_3_more_choices_than_tokens_reserve_and_send_nothing(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin, replyTokens=3) as gw:
        for stream in (False, True):
            answer = httpx.post(gw.url + "/openai/v1/chat/completions", timeout=30,
                                headers={"authorization": f"Bearer {gw.token}"},
                                json={"model": "acme/a1", "messages": HELLO, "n": 4,
                                      "stream": stream})  # fmt: skip
            assert answer.status_code == 400
            assert answer.json()["error"]["code"] == "invalid_request"
            assert "`n`" in answer.json()["error"]["message"]
        asked = len(standin.requests)
        ok = httpx.post(gw.url + "/openai/v1/chat/completions", timeout=30,
                        headers={"authorization": f"Bearer {gw.token}"},
                        json={"model": "acme/a1", "messages": HELLO, "n": 3})  # fmt: skip
        assert ok.status_code == 200
        assert standin.bodies[-1]["max_tokens"] == 1
    assert asked == 0
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT status FROM reservations").all()
    assert [tuple(r) for r in rows] == [("succeeded",)]  # only the request that fit


THINK: dict[str, Any] = {"type": "enabled", "budget_tokens": 10000}


@pytest.mark.parametrize(
    ("allowance", "asked", "budget", "sent_max", "sent_budget"),
    [(4096, 16000, 10000, 4096, 3072), (4096, 16000, 2000, 4096, 2000),
     (1500, 16000, 10000, 1500, 1024), (8192, 3000, 2999, 3000, 2999),
     (8192, 3000, 3000, 3000, 1976)],
)  # fmt: skip
def test_r_gw_3_a_callers_thinking_budget_stays_inside_the_max_tokens_sent(
    allowance: int, asked: int, budget: int, sent_max: int, sent_budget: int
) -> None:
    """Before: `max_tokens` was clamped to the allowance (4096 by default) and the caller's
    thinking budget passed as sent, so a budget at or above it was a 400 from Anthropic."""
    body = {"model": "bolt/b1", "messages": HELLO, "max_tokens": asked,
            "thinking": {**THINK, "budget_tokens": budget}}  # fmt: skip
    assert Format.ANTHROPIC.fits_allowance(body, allowance)
    out = Format.ANTHROPIC.upstream_body(body, Limits("b1", allowance, "max_tokens"))
    assert out["max_tokens"] == sent_max
    assert out["thinking"] == {"type": "enabled", "budget_tokens": sent_budget}
    assert 1024 <= out["thinking"]["budget_tokens"] < out["max_tokens"]


def test_r_gw_3_thinking_without_room_for_its_minimum_reserves_and_sends_nothing(
    home: Path,
) -> None:
    body = {"model": "bolt/b1", "max_tokens": 16000, "messages": HELLO, "thinking": THINK}
    assert not Format.ANTHROPIC.fits_allowance(body, 1024)
    with StandIn() as standin, gateway(home, standin, replyTokens=1024) as gw:
        answer = httpx.post(gw.url + "/anthropic/v1/messages", json=body, timeout=30,
                            headers={"x-api-key": gw.token})  # fmt: skip
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "invalid_request"
        assert standin.requests == []
    wide = home.parent / "wide"
    wide.mkdir(mode=0o700)
    with StandIn() as standin, gateway(wide, standin) as gw:  # the default allowance: 4096
        message = gw.anthropic().messages.create(
            model="bolt/b1", max_tokens=16000, messages=HELLO, extra_body={"thinking": THINK}
        )
        sent = standin.bodies[0]
    assert message.content
    assert sent["max_tokens"] == 4096
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 3072}
    with Ledger.open(home).db.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM reservations").scalar() == 0
