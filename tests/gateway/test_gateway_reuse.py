"""A streamed answer that ended with its terminator leaves its upstream connection in the pool
for the next call (R-GW-5): real providers keep connections alive, and closing one with its last
bytes unread costs every streamed call a new connection (and a TLS handshake). Against a real
`ledger serve` and a keep-alive stand-in, with the official SDKs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway

HELLO: Any = [{"role": "user", "content": "hello"}]


def test_r_gw_5_finished_streams_reuse_one_upstream_connection(home: Path) -> None:
    answer = Scripted(text="one two three", stream_pieces=3)
    with StandIn(default=answer, keep_alive=True) as standin, gateway(home, standin) as gw:
        for _ in range(3):
            chunks = list(gw.openai().chat.completions.create(
                model="acme/a1", messages=HELLO, stream=True))  # fmt: skip
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        for _ in range(3):
            with gw.anthropic().messages.stream(
                model="bolt/b1", max_tokens=50, messages=HELLO
            ) as stream:
                assert stream.get_final_message().content
        for _ in range(2):  # across formats too: an OpenAI caller served by an Anthropic route
            list(gw.openai().chat.completions.create(model="bolt/b1", messages=HELLO,
                                                      stream=True))  # fmt: skip
        asked = len(standin.requests)
        connections = standin.connections
    assert asked == 8
    assert connections == 1  # the stand-in's providers share one origin: one pooled connection
