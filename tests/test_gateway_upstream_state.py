"""The gateway's upstream requests carry nothing of another caller's (R-GW-2): a provider's
`Set-Cookie` on one answer is never sent with the next request, whoever makes it, and every
request names the gateway as its user agent. Against a real `ledger serve` and the stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledger.gateway.upstream import USER_AGENT
from ledger.standin import Scripted, StandIn
from tests.gateway_setup import gateway

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
