"""Figure `responses` (R-FMT-2, issue 44): the Responses endpoint's overhead against the chat
endpoint's, side by side in one run against one service and one stand-in.

- chat overhead = gateway chat call (acme/a1) - the same call straight to the stand-in;
- Responses overhead, native = gateway `POST /openai/v1/responses` on a native Responses route
  (rapid/r1) - the body the gateway sent upstream, posted straight to the stand-in;
- Responses overhead, translated = the same Responses call on the chat route (acme/a1,
  translated both ways) - the chat body the gateway sent upstream, straight to the stand-in.

Each is the p50 at concurrency 1 of per-pair differences, the three pairs alternating in one loop
(short variant: non-streaming, a short answer). Targets: native ÷ chat ≤ 1.2, translated ÷
native ≤ 1.3.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.common import Row, Settings, Stats, bench_policy, ratio_row, time_row
from bench.contention import percentile
from bench.gateway import _timed_post
from ledger.standin.server import Scripted, StandIn
from tests.support.responses_setup import responses_catalog
from tests.support.serving import running

NATIVE_TARGET = 1.2
TRANSLATED_TARGET = 1.3
CHAT: dict[str, Any] = {"model": "acme/a1", "messages": [{"role": "user", "content": "hello"}]}
NATIVE: dict[str, Any] = {"model": "rapid/r1", "input": "hello", "store": False}
TRANSLATED: dict[str, Any] = {**NATIVE, "model": "acme/a1"}


def run(root: Path, settings: Settings) -> list[Row]:
    """The three overheads and their two ratios."""
    calls = 20 if settings.quick else 200
    answer = Scripted(text="a short answer")
    with (
        tempfile.TemporaryDirectory(prefix="ledger-resp-") as short,
        StandIn(default=answer, keep_alive=True) as standin,
    ):
        home = Path(short) / "gw"
        home.mkdir(mode=0o700)
        (home / "catalog.json").write_text(json.dumps(responses_catalog(standin)))
        (home / "recovery.json").write_text(json.dumps(bench_policy().to_json()))
        with running(home, "--listen", "127.0.0.1:0") as served, httpx.Client(
            headers={"authorization": f"Bearer {served.token}"}, timeout=60
        ) as client:  # fmt: skip
            gw = f"{served.url}/openai/v1"
            chat_url, resp_url = standin.base_url_openai + "/chat/completions", \
                standin.base_url_openai + "/responses"  # fmt: skip
            pairs: list[tuple[str, dict[str, Any], str]] = []
            for path, body, direct in ((f"{gw}/chat/completions", CHAT, chat_url),
                                       (f"{gw}/responses", NATIVE, resp_url),
                                       (f"{gw}/responses", TRANSLATED, chat_url)):  # fmt: skip
                for _ in range(5):  # warm every path
                    _timed_post(client, path, body)
                pairs.append((path, body, direct))
            # the same call direct is exactly the body the gateway sent upstream
            sent = {}
            for path, body, _ in pairs:
                _timed_post(client, path, body)
                sent[(path, body["model"])] = standin.bodies[-1]
            over: list[list[float]] = [[], [], []]
            for _ in range(calls):
                for index, (path, body, direct) in enumerate(pairs):
                    g = _timed_post(client, path, body)
                    d = _timed_post(client, direct, sent[(path, body["model"])])
                    over[index].append(g - d)
    chat, native, translated = (percentile(o, 0.5) for o in over)
    native_ratio = Stats.of([native / chat]) if chat > 0 else Stats.of([float("inf")])
    translated_ratio = Stats.of([translated / native]) if native > 0 else Stats.of([float("inf")])
    rows = [
        time_row("responses: chat endpoint overhead p50 (gateway - direct)", Stats.of([chat])),
        time_row("responses: Responses overhead p50, native route", Stats.of([native])),
        time_row(
            "responses: Responses overhead p50, translated to a chat route", Stats.of([translated])
        ),
        ratio_row(
            "responses: Responses overhead / chat overhead (native, p50, c=1)",
            native_ratio,
            f"<= {NATIVE_TARGET:.1f}",
            native_ratio.median <= NATIVE_TARGET,
            note=f"n={calls}",
        ),
        ratio_row(
            "responses: translated / native Responses overhead (p50, c=1)",
            translated_ratio,
            f"<= {TRANSLATED_TARGET:.1f}",
            translated_ratio.median <= TRANSLATED_TARGET,
            note=f"n={calls}",
        ),
    ]
    return rows
