"""OpenAI's usage-only stream chunk reaches a caller only when it asked for it (R-GW-3, R-GW-5):
the gateway always asks upstream for usage (`stream_options.include_usage`), to settle the
stream at its actual cost, but a caller that did not ask gets what OpenAI itself would send, every
chunk with a choice (code that reads `chunk.choices[0]` would fail on the extra chunk). Against a
real `ledger serve` and the stand-in, with the official SDK, from an OpenAI route and from an
Anthropic one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway

HELLO: Any = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("model", ["acme/a1", "bolt/b1"])
@pytest.mark.parametrize("asked", [False, True])
def test_r_gw_5_the_usage_chunk_only_when_asked(home: Path, model: str, asked: bool) -> None:
    answer = Scripted(text="one two three", stream_pieces=3, input_tokens=11, output_tokens=7)
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if asked else {}
    with StandIn(default=answer) as standin, gateway(home, standin) as gw:
        chunks = list(gw.openai().chat.completions.create(
            model=model, messages=HELLO, stream=True, **extra))  # fmt: skip
        sent = standin.bodies[0]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three"
    if model == "acme/a1":
        assert sent["stream_options"] == {"include_usage": True}  # always asked upstream
    usage_chunks = [c for c in chunks if not c.choices]
    if asked:
        assert len(usage_chunks) == 1
        assert usage_chunks[0].usage is not None
        assert usage_chunks[0].usage.completion_tokens == 7
    else:
        assert usage_chunks == []  # every chunk has a choice, as OpenAI sends it
    with Ledger.open(home).db.engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT status, output_tokens, subkind FROM reservations"
        ).one()
    assert tuple(row) == ("succeeded", 7, None)  # settled at the usage read either way
