"""What the gateway sends upstream (R-GW-2): nothing of another caller's (a provider's
`Set-Cookie` on one answer is never sent with the next request, whoever makes it), the gateway
named as user agent, and never a credential HTTP cannot carry (the attempt fails, the value is
quoted nowhere). Against a real `ledger serve` and the stand-in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger.api import Ledger
from ledger.gateway.upstream import USER_AGENT
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway, gateway_catalog
from tests.support.serving import running

HELLO: Any = [{"role": "user", "content": "hello"}]


def test_r_gw_2_an_upstream_cookie_never_reaches_the_next_callers_request(home: Path) -> None:
    """Before: the gateway sent through one shared httpx client, whose cookie jar kept a
    provider's cookie from one caller's answer and sent it with every later request."""
    cookie = Scripted(text="first", headers=(("set-cookie", "edge=caller-one; Path=/"),))
    with StandIn(default=cookie, keep_alive=True) as standin, gateway(home, standin) as gw:
        for source, stream in (("caller-one", False), ("caller-two", False), ("c3", True)):
            client = gw.openai(**{"X-Ledger-Source": source})
            if stream:
                list(client.chat.completions.create(model="acme/a1", messages=HELLO,
                                                    stream=True))  # fmt: skip
            else:
                client.chat.completions.create(model="acme/a1", messages=HELLO)
        sent = [dict(r.headers) for r in standin.requests]
    assert len(sent) == 3
    for headers in sent:
        assert not any(name.lower() == "cookie" for name in headers), headers
        agent = [v for k, v in headers.items() if k.lower() == "user-agent"]
        assert agent == [USER_AGENT]


UNSENDABLE_KEY = "clé-ключ-upstream-secret"


@pytest.mark.parametrize("stream", [False, True])
def test_r_gw_2_a_credential_http_cannot_carry_fails_the_attempt_and_is_quoted_nowhere(
    home: Path, stream: bool
) -> None:
    """Before: httpx refused to encode the header and the gateway answered a bare 500, logging
    a traceback whose last line named one of the credential's characters and its position.
    Now the attempt fails as the worker fails the same fault (nothing sent, the reservation
    settled failed) and the caller gets the format's own 502."""
    body = {"model": "bolt/b1", "max_tokens": 20, "messages": HELLO, "stream": stream}
    with StandIn(default=Scripted(text="hi")) as standin:
        (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
        env = {"BOLT_KEY": UNSENDABLE_KEY}
        with running(home, "--listen", "127.0.0.1:0", env=env) as served:
            assert served.url is not None
            answer = httpx.post(served.url + "/anthropic/v1/messages", json=body, timeout=30,
                                headers={"x-api-key": str(served.token)})  # fmt: skip
            asked = len(standin.requests)
        log = "".join(served.log)
    assert answer.status_code == 502
    document = answer.json()
    assert document["type"] == "error"
    assert document["error"]["code"] == "upstream_error"
    assert asked == 0  # nothing was sent
    for shown in (answer.text, log):
        assert "Traceback" not in shown
        assert "position" not in shown
        assert not any(ch in shown for ch in "éключ"), shown[-400:]
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT status, kind FROM reservations").all()
    assert rows
    assert all(tuple(r) == ("failed", "unknown") for r in rows), rows


def test_r_gw_5_an_answer_without_usage_is_settled_at_its_estimate_marked(home: Path) -> None:
    """As a stream without usage is: the estimate, marked `usage_estimated` (before: the same
    cost, unmarked, so `status` could not tell a measured cost from an assumed one)."""
    reply = {"id": "x", "object": "chat.completion", "created": 1, "model": "a1",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                          "finish_reason": "stop"}]}  # fmt: skip
    with StandIn(default=Scripted(raw_body=json.dumps(reply).encode())) as standin, \
            gateway(home, standin) as gw:  # fmt: skip
        gw.openai().chat.completions.create(model="acme/a1", messages=HELLO)
    with Ledger.open(home).db.engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT status, cost_micro, estimate_micro, subkind FROM reservations"
        ).one()
    assert row[0] == "succeeded"
    assert row[1] == row[2] > 0  # never free
    assert row[3] == "usage_estimated"
