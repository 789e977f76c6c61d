"""Figure `gateway` (SPEC section 19): the gateway against the same call straight to the stand-in,
side by side in one run.

- overhead = (gateway call - the same call straight to the stand-in), p50 at concurrency 1, ÷ the
  in-process reserve+settle cycle (≤ 2.0: the gateway costs little more than the two durable
  commits it must make);
- at 16 concurrent streaming clients (each alternating a gateway stream and the same stream
  direct, one overhead per pair), the overhead's p99 ≤ 4 x its p50;
- time to first byte of a stream through the gateway - direct, p50, ÷ the same first byte through
  a bare relay on the same stack (bench/relay_floor.py: uvicorn, Starlette, httpx; no ledger) -
  direct, ≤ 2.0; beside it, not goals, the same to the first content event on both sides (the
  gateway relays nothing before it, R-GW-5, while the direct stream's first byte is a role-only
  chunk) and the first byte beyond the in-process reserve in floors;
- LiteLLM's proxy beside it (full mode only; `--quick` skips it with a note): the bench starts
  `litellm --config CONFIG --port PORT --host 127.0.0.1` (no database) against the same stand-in
  and measures it the same way, alternating with the gateway's pairs in the same loops: its
  overhead (proxy call - the same call straight to the stand-in, p50 at concurrency 1; ledger's
  overhead ÷ LiteLLM's ≤ 1.0) and its time to first byte of a stream (proxy - the same stream
  straight to the stand-in, p50; (gateway - direct) ÷ (LiteLLM - direct) ≤ 1.0), while every
  ledger call makes two durable commits and commits its reserve before its first byte. Each
  "same call direct" for LiteLLM is exactly the body LiteLLM sent upstream for that kind of call
  (taken from the stand-in after the warm-up). LiteLLM is a bench-only tool, not a dependency:
  install it in a venv of its own and put that venv's `bin` on PATH (bench/litellm_proxy.py);
  without it the rows say so.

The in-process cycle and reserve each figure is divided by are timed in the same loops, one
between each pair (`_InProcess`), so the load beside the run weighs on both sides alike.
At concurrency 1 each side's timed request (gateway, bare relay, LiteLLM) starts after a pause of
`QUIET_S`, so no process's work after its answer (the gateway's settle, LiteLLM's logging) runs
on another side's clock: measured under load, the gateway's first byte right after a LiteLLM pair
was 1.3 ms slower than after a pause.

Invariant: the service is a real `ledger serve` subprocess over TCP on its own state directory;
the upstream is the stand-in, keeping its connections alive as a real provider does (every side,
direct, gateway and LiteLLM, reuses them); budgets are large enough that nothing is refused.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    Row,
    Settings,
    Stats,
    bench_policy,
    ledger_cycle,
    make_home,
    ms,
    open_ledger,
    per_cycle,
    ratio_row,
    time_row,
)
from bench.contention import percentile
from bench.litellm_proxy import INSTALL, MASTER_KEY, ProxyError, available, litellm_proxy
from bench.relay_floor import relay_floor
from ledger.records import Success
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway_catalog
from tests.support.serving import running

OVERHEAD_TARGET = 2.0
TAIL_TARGET = 4.0
RELAY_TARGET = 2.0
LITELLM_TARGET = 1.0
CLIENTS = 16
# a pause before each side's timed request at concurrency 1, so that no process's work after its
# answer (the gateway's settle, LiteLLM's logging) lands on another side's clock
QUIET_S = 0.05
BODY: dict[str, Any] = {"model": "acme/a1", "messages": [{"role": "user", "content": "hello"}]}


def _direct_body(stream: bool) -> dict[str, Any]:
    # what the gateway sends upstream for BODY: the route's id and the reply allowance
    body: dict[str, Any] = {**BODY, "model": "a1", "max_tokens": 4096}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def _timed_post(client: httpx.Client, url: str, body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    answer = client.post(url, json=body)
    answer.raise_for_status()
    return time.perf_counter() - t0


class _Timed:
    """One streaming request's times (seconds from sending it): its first body byte, its first
    content event (a chunk whose delta carries text) and its end."""

    def __init__(self) -> None:
        self.first_byte = 0.0
        self.first_content = 0.0
        self.total = 0.0


def _has_content(line: bytes) -> bool:
    """Whether one SSE line is an OpenAI chunk whose delta carries text (a role-only chunk, the
    usage chunk and `[DONE]` do not)."""
    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
        return False
    try:
        choices = json.loads(line[6:]).get("choices") or []
    except ValueError:
        return False
    return bool(choices and (choices[0].get("delta") or {}).get("content"))


def _timed_stream(client: httpx.Client, url: str, body: dict[str, Any]) -> _Timed:
    """The times of one streaming request (the body read as bytes, lines split here, so the first
    byte is timed as it arrives)."""
    timed = _Timed()
    t0 = time.perf_counter()
    pending = b""
    with client.stream("POST", url, json=body) as answer:
        answer.raise_for_status()
        for chunk in answer.iter_bytes():
            now = time.perf_counter() - t0
            if not timed.first_byte:
                timed.first_byte = now
            if timed.first_content:
                continue
            *lines, pending = (pending + chunk).split(b"\n")
            if any(_has_content(line.strip()) for line in lines):
                timed.first_content = now
    timed.total = time.perf_counter() - t0
    return timed


class _InProcess:
    """The in-process ledger the gateway's figures are divided by, timed one cycle (or one
    reserve) at a time between the gateway's pairs, so whatever else loads the machine then
    (LiteLLM's proxy idling beside it, another tenant's disk) weighs on both sides alike."""

    def __init__(self, root: Path) -> None:
        self.ledger = open_ledger(make_home(root, "gw-inproc"))
        self.i = 0
        self.cycles: list[float] = []
        self.reserves: list[float] = []
        per_cycle(self._cycle, 0, 10)  # warm

    def _cycle(self, i: int) -> None:
        ledger_cycle(self.ledger, i)

    def cycle(self) -> None:
        """Time one reserve+settle cycle."""
        self.i += 1
        self.cycles.append(per_cycle(self._cycle, self.i, 1))

    def reserve(self) -> None:
        """Time one reserve (then settle it, untimed, so the state stays as it was)."""
        self.i += 1
        t0 = time.perf_counter()
        held = self.ledger.reserve(f"r-{self.i % 50}", "alpha/m0", input_bytes=2000)
        self.reserves.append(time.perf_counter() - t0)
        self.ledger.settle(held.id, Success(input_tokens=500, output_tokens=200))

    def close(self) -> None:
        self.ledger.close()


def _concurrently(
    n: int, fn: Callable[[httpx.Client], list[float]], headers: dict[str, str]
) -> list[float]:
    out: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n)

    def one() -> None:
        with httpx.Client(headers=headers, timeout=60) as client:
            barrier.wait()
            got = fn(client)
        with lock:
            out.extend(got)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def run(root: Path, settings: Settings) -> list[Row]:
    """All gateway figures against one service and one stand-in."""
    inproc = _InProcess(root)
    calls = 20 if settings.quick else 200
    per_client = 3 if settings.quick else 20
    answer = Scripted(text="a short answer", stream_pieces=4)
    with (
        contextlib.closing(inproc),
        tempfile.TemporaryDirectory(prefix="ledger-gw-") as short,
        StandIn(default=answer, keep_alive=True) as standin,
        relay_floor(standin.base_url_openai + "/chat/completions") as floor_url,
    ):
        home = Path(short) / "gw"
        home.mkdir(mode=0o700)
        (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
        (home / "recovery.json").write_text(json.dumps(bench_policy().to_json()))
        with running(home, "--listen", "127.0.0.1:0") as served:
            assert served.url is not None
            auth = {"authorization": f"Bearer {served.token}"}
            gw_url = served.url + "/openai/v1/chat/completions"
            direct_url = standin.base_url_openai + "/chat/completions"
            over: list[float] = []
            litellm_over: list[float] = []
            ttfb: list[float] = []
            ttfc: list[float] = []
            floor: list[float] = []
            litellm_ttfb: list[float] = []
            litellm_ttfc: list[float] = []
            streamed = {**BODY, "stream": True}
            with (  # LiteLLM's proxy runs only for the concurrency-1 pairs
                httpx.Client(headers=auth, timeout=60) as client,
                httpx.Client(
                    headers={"authorization": f"Bearer {MASTER_KEY}"}, timeout=60
                ) as to_litellm,
                _maybe_litellm(Path(short), standin, settings) as proxy,
            ):
                ll_url = proxy.url + "/v1/chat/completions" if proxy.url else None
                for _ in range(5):  # warm every path
                    _timed_post(client, gw_url, BODY)
                    _timed_post(client, direct_url, _direct_body(False))
                    if ll_url:
                        _timed_post(to_litellm, ll_url, BODY)
                # LiteLLM's "same call direct" is exactly the body it sent upstream
                ll_direct = standin.bodies[-1] if ll_url else None
                for _ in range(calls):  # alternating: gateway pair, then LiteLLM pair
                    time.sleep(QUIET_S)
                    gw = _timed_post(client, gw_url, BODY)
                    direct = _timed_post(client, direct_url, _direct_body(False))
                    over.append(gw - direct)
                    inproc.cycle()
                    if ll_url and ll_direct is not None:
                        time.sleep(QUIET_S)
                        ll = _timed_post(to_litellm, ll_url, BODY)
                        direct = _timed_post(to_litellm, direct_url, ll_direct)
                        litellm_over.append(ll - direct)
                for _ in range(5):  # warm the relay's (and LiteLLM's) streamed path
                    _timed_stream(client, floor_url, _direct_body(True))
                    if ll_url:
                        _timed_stream(to_litellm, ll_url, streamed)
                # the same for a stream: the body LiteLLM sent upstream for it
                ll_stream_direct = standin.bodies[-1] if ll_url else None
                for _ in range(calls // 2):  # alternating: gateway, bare relay, LiteLLM
                    time.sleep(QUIET_S)
                    g = _timed_stream(client, gw_url, streamed)
                    d = _timed_stream(client, direct_url, _direct_body(True))
                    time.sleep(QUIET_S)
                    bare = _timed_stream(client, floor_url, _direct_body(True))
                    ttfb.append(g.first_byte - d.first_byte)
                    floor.append(bare.first_byte - d.first_byte)
                    ttfc.append(g.first_content - d.first_content)
                    inproc.reserve()
                    if ll_url and ll_stream_direct is not None:
                        time.sleep(QUIET_S)
                        ll_s = _timed_stream(to_litellm, ll_url, streamed)
                        ll_d = _timed_stream(to_litellm, direct_url, ll_stream_direct)
                        litellm_ttfb.append(ll_s.first_byte - ll_d.first_byte)
                        litellm_ttfc.append(ll_s.first_content - ll_d.first_content)

            def pairs(c: httpx.Client) -> list[float]:
                # each client alternates: gateway, then the same call direct; one overhead a pair
                return [
                    _timed_stream(c, gw_url, streamed).total
                    - _timed_stream(c, direct_url, _direct_body(True)).total
                    for _ in range(per_client)
                ]

            many = _concurrently(CLIENTS, pairs, auth)
    cycle_s = statistics.median(inproc.cycles)
    reserve_s = statistics.median(inproc.reserves)
    p50 = percentile(over, 0.5)
    ratio = Stats.of([p50 / cycle_s])
    tail50, tail99 = percentile(many, 0.5), percentile(many, 0.99)
    tail = Stats.of([tail99 / tail50]) if tail50 > 0 else Stats.of([float("inf")])
    ttfb_p50 = percentile(ttfb, 0.5)
    ttfc_p50 = percentile(ttfc, 0.5)
    floor_p50 = percentile(floor, 0.5)
    return [
        time_row("gateway: overhead p50 at concurrency 1 (gateway - direct)", Stats.of([p50])),
        time_row("gateway: in-process reserve+settle cycle", Stats.of([cycle_s])),
        ratio_row(
            "gateway: overhead p50 / in-process reserve+settle cycle",
            ratio,
            f"<= {OVERHEAD_TARGET:.1f}",
            ratio.median <= OVERHEAD_TARGET,
            note=f"n={calls}",
        ),
        ratio_row(
            f"gateway: {CLIENTS} streaming clients, overhead p99 / p50",
            tail,
            f"<= {TAIL_TARGET:.0f}",
            tail.median <= TAIL_TARGET,
            note=f"overhead p50 {ms(tail50)}, p99 {ms(tail99)}",
        ),
        time_row("gateway: time to first byte, gateway - direct (p50)", Stats.of([ttfb_p50])),
        ratio_row(  # issue 46: the absolute "reserve + 2 ms" is retired for this ratio
            "gateway: time to first byte, (gateway - direct) / (bare relay - direct)",
            relay := Stats.of([ttfb_p50 / floor_p50 if floor_p50 > 0 else float("inf")]),
            f"<= {RELAY_TARGET:.1f}",
            relay.median <= RELAY_TARGET,
            note=f"in-process reserve {ms(reserve_s)}; the relay: uvicorn + Starlette + httpx",
        ),
        Row(  # not a goal: what R-GW-5 lets the gateway do (it answers at the first content event)
            "gateway: time to first content event, gateway - direct (p50)",
            ms(ttfc_p50),
            "",
            "",
            None,
            note="both sides timed to the first chunk carrying text (the stand-in sends its "
            "role-only chunk together with the first text)",
        ),
        Row(  # not a goal: what the stack alone costs (bench/relay_floor.py)
            "gateway: floor, a bare relay on the same stack: time to first byte - direct (p50)",
            ms(floor_p50),
            "",
            "",
            None,
            note="uvicorn + Starlette + httpx forwarding the bytes, no ledger: what the stack "
            "alone costs, the first-byte ratio's denominator",
        ),
        Row(  # not a goal: the first byte beyond the reserve, in floors (machine-independent)
            "gateway: time to first byte beyond the reserve / the floor",
            f"{(ttfb_p50 - reserve_s) / floor_p50:.2f}x" if floor_p50 > 0 else "n/a",
            "",
            "",
            None,
            note="(gateway - direct - in-process reserve) / (bare relay - direct): what the "
            "gateway adds beyond its reserve, counted in what the stack alone costs",
        ),
        *_litellm_rows(p50, litellm_over, proxy.reason, calls),
        *_litellm_first_byte_rows(ttfb_p50, litellm_ttfb, litellm_ttfc, proxy.reason, calls // 2),
    ]


class _Proxy:
    """LiteLLM's proxy for one run: its base URL, or why there is none."""

    def __init__(self, url: str | None = None, reason: str = "") -> None:
        self.url = url
        self.reason = reason


@contextlib.contextmanager
def _maybe_litellm(workdir: Path, standin: StandIn, settings: Settings) -> Iterator[_Proxy]:
    if settings.quick:
        yield _Proxy(reason="skipped in --quick mode (run `python -m bench --only gateway`)")
        return
    if available() is None:
        yield _Proxy(reason=f"litellm[proxy] is not installed: {INSTALL}")
        return
    with contextlib.ExitStack() as stack:  # the proxy is stopped when the run ends
        try:
            proxy = litellm_proxy(workdir, BODY["model"], "a1", standin.base_url_openai)
            url: str | None = stack.enter_context(proxy)
            reason = ""
        except ProxyError as e:
            url, reason = None, str(e)
        yield _Proxy(url, reason)


LITELLM_FIGURE = "gateway: LiteLLM proxy overhead p50"


def _litellm_rows(ledger_p50: float, over: list[float], reason: str, calls: int) -> list[Row]:
    if not over:
        return [Row(LITELLM_FIGURE, "skipped", "", note=reason)]
    p50 = percentile(over, 0.5)
    ratio = Stats.of([ledger_p50 / p50]) if p50 > 0 else Stats.of([float("inf")])
    return [
        time_row(LITELLM_FIGURE, Stats.of([p50])).with_note(
            f"n={calls}, alternating with the gateway's pairs; no database"
        ),
        ratio_row(
            "gateway: ledger overhead / LiteLLM overhead",
            ratio,
            f"<= {LITELLM_TARGET:.1f}",
            ratio.median <= LITELLM_TARGET,
            note="each ledger call makes two durable commits; LiteLLM's none",
        ),
    ]


LITELLM_FIRST_BYTE = "gateway: LiteLLM proxy time to first byte - direct (p50)"


def _litellm_first_byte_rows(
    ledger_ttfb: float, ttfb: list[float], ttfc: list[float], reason: str, pairs: int
) -> list[Row]:
    """The first byte of a stream through LiteLLM's proxy - the same stream direct (exactly the
    body LiteLLM sent upstream), and the gateway's first byte in those units."""
    if not ttfb:
        return [Row(LITELLM_FIRST_BYTE, "skipped", "", note=reason)]
    p50 = percentile(ttfb, 0.5)
    ratio = Stats.of([ledger_ttfb / p50]) if p50 > 0 else Stats.of([float("inf")])
    return [
        time_row(LITELLM_FIRST_BYTE, Stats.of([p50])).with_note(
            f"n={pairs}, alternating with the gateway's first-byte pairs; first content event "
            f"- direct {ms(percentile(ttfc, 0.5))}"
        ),
        ratio_row(
            "gateway: time to first byte, (gateway - direct) / (LiteLLM proxy - direct)",
            ratio,
            f"<= {LITELLM_TARGET:.1f}",
            ratio.median <= LITELLM_TARGET,
            note="the gateway commits a reserve before its first byte; LiteLLM commits nothing",
        ),
    ]
