"""Figure `otel` (issue 48, R-OTEL-1): a gateway request's time with tracing on, its collector
hanging, over the same request with tracing off. `python -m bench.otel [--requests N]`.
`--cost N`: instead, the tracing's own CPU per gateway request in this process (the seam's calls
for a request with one attempt, on the calling thread), which the machine's other load does not
blur as it blurs the ratio.

Two `ledger serve` processes run at once against one stand-in: A without an OTLP endpoint, B
exporting to a receiver that reads every export and never answers (tests/support/otlp_receiver.py,
`silent`), its queue bounded small (OTEL_BSP_MAX_QUEUE_SIZE) so it is full within the run. The
requests alternate A, B, A, B (the same machine noise hits both); the row is the median of B's
times over the median of A's, and the note B's dropped-span count from its `/metrics`
(`ledger_otel_spans_dropped`, which must be > 0: the spans were dropped, not waited for).

Invariant: both services are real subprocesses over TCP, each on its own state directory in a
temporary directory; the receiver's hanging handlers are released when the run ends.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.common import Row, Settings, bench_policy
from bench.gateway import BODY
from ledger import telemetry
from ledger.attempt import Attempt
from ledger.kinds import AttemptRole, AttemptStatus
from ledger.records import Reservation, SettleResult, Success
from ledger.standin.server import StandIn
from tests.support.gateway_setup import gateway_catalog
from tests.support.otlp_receiver import Receiver
from tests.support.serving import Served, running

TARGET = 1.05
QUEUE = 64  # spans (two a request): full after ~32 requests while the collector hangs
COST_HEADERS = {"content-type": "application/json", "authorization": "Bearer x"}


def _home(scratch: Path, name: str, standin: StandIn) -> Path:
    home = scratch / name
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
    (home / "recovery.json").write_text(json.dumps(bench_policy().to_json()))
    return home


def _timed(client: httpx.Client) -> float:
    started = time.perf_counter()
    answer = client.post("/openai/v1/chat/completions", json=BODY)
    elapsed = time.perf_counter() - started
    answer.raise_for_status()
    return elapsed


def _dropped(served: Served) -> float:
    with served.client(tcp=True) as client:
        text = client.get("/metrics").text
    lines = [x for x in text.splitlines() if x.startswith("ledger_otel_spans_dropped ")]
    return float(lines[0].split()[1]) if lines else -1.0


def measure(scratch: Path, requests: int) -> tuple[float, float, float, float]:
    """(ratio B/A of the medians, A's median s, B's median s, B's dropped spans)."""
    with ExitStack() as stack:
        receiver = stack.enter_context(Receiver(silent=True))
        standin = stack.enter_context(StandIn())
        plain = stack.enter_context(
            running(_home(scratch, "plain", standin), "--listen", "127.0.0.1:0")
        )
        traced = stack.enter_context(running(
            _home(scratch, "traced", standin), "--listen", "127.0.0.1:0",
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                 "OTEL_BSP_MAX_QUEUE_SIZE": str(QUEUE), "OTEL_BSP_SCHEDULE_DELAY": "20"},
        ))  # fmt: skip
        a_client = stack.enter_context(plain.client(tcp=True))
        b_client = stack.enter_context(traced.client(tcp=True))
        for _ in range(10):  # warm both (connections, caches) before timing
            _timed(a_client)
            _timed(b_client)
        a_times: list[float] = []
        b_times: list[float] = []
        for i in range(requests):
            pair = [(a_client, a_times), (b_client, b_times)]
            for client, times in pair if i % 2 == 0 else reversed(pair):
                times.append(_timed(client))
        dropped = _dropped(traced)
    a, b = statistics.median(a_times), statistics.median(b_times)
    return b / a, a, b, dropped


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def rss_growth(scratch: Path, requests: int, threads: int = 4) -> tuple[float, float, float]:
    """`requests` gateway requests to a traced service whose collector hangs (its queue at the
    default size): (RSS after a warm-up, RSS at the end, in MiB; dropped spans)."""
    with ExitStack() as stack:
        receiver = stack.enter_context(Receiver(silent=True))
        standin = stack.enter_context(StandIn())
        traced = stack.enter_context(running(
            _home(scratch, "traced", standin), "--listen", "127.0.0.1:0",
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint},
        ))  # fmt: skip
        clients = [stack.enter_context(traced.client(tcp=True)) for _ in range(threads)]
        for client in clients:
            for _ in range(50):
                _timed(client)
        before = _rss_mib(traced.proc.pid)
        with ThreadPoolExecutor(threads) as pool:
            share = requests // threads
            list(pool.map(lambda c: [_timed(c) for _ in range(share)], clients))
        after = _rss_mib(traced.proc.pid)
        dropped = _dropped(traced)
    return before, after, dropped


def _traced_request(number: int) -> None:
    """The seam's calls for one gateway request with one answered attempt, as the gateway makes
    them (the reservation and the settle's result made here, not by a ledger)."""
    with telemetry.gateway_request(COST_HEADERS, "/openai/v1/chat/completions") as traced:
        reservation = Reservation(number, "job", "acme/a1", 0, 1, None, AttemptRole.PRIMARY,
                                  AttemptStatus.OPEN)  # fmt: skip
        attempt: Attempt[None] = Attempt(1, "acme/a1", reservation, "acme/a1", None)
        telemetry.watch(attempt, "acme", "a1", telemetry.max_tokens({"max_tokens": 64}))
        telemetry.replied(attempt, {"model": "a1"})
        attempt.outcome = Success(input_tokens=10, output_tokens=5)
        attempt.record(SettleResult(number, "job", "acme/a1", AttemptStatus.SUCCEEDED, False))
        traced.answered(200)


def _thread_cpu_us(requests: int, rounds: int = 21) -> float:
    """The least CPU of this thread per `_traced_request` over `rounds` rounds, in µs."""
    for number in range(100):  # warm
        _traced_request(number)
    best = float("inf")
    for _ in range(rounds):
        started = time.thread_time()
        for number in range(requests):
            _traced_request(number)
        best = min(best, (time.thread_time() - started) / requests)
    return best * 1e6


def cost(requests: int) -> tuple[float, float]:
    """(µs a request with tracing off, µs with tracing on and its collector hanging)."""
    off = _thread_cpu_us(requests)
    with Receiver(silent=True) as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
               "OTEL_BSP_MAX_QUEUE_SIZE": str(QUEUE), "OTEL_BSP_SCHEDULE_DELAY": "20"}  # fmt: skip
        assert telemetry.configure(env, print)
        try:
            on = _thread_cpu_us(requests)
        finally:
            telemetry.shutdown()
    return off, on


def run(_root: Path, settings: Settings) -> list[Row]:
    """The figure's row (quick: 40 requests a side; else 200)."""
    requests = 40 if settings.quick else 200
    with tempfile.TemporaryDirectory(prefix="ledger-otel-") as short:  # a short socket path
        ratio, a, b, dropped = measure(Path(short), requests)
    return [
        Row(
            f"otel: gateway request, collector hanging / tracing off ({requests} pairs)",
            f"{ratio:.3f}x",
            f"{a * 1000:.2f} ms vs {b * 1000:.2f} ms (medians)",
            f"<= {TARGET}x",
            ratio <= TARGET,
            f"dropped spans shown on /metrics: {dropped:.0f} (must be > 0)",
        )
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.otel")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--cost", type=int, default=0, metavar="N",
                        help="instead: the tracing's CPU per request in this process (rounds of "
                        "N requests)")  # fmt: skip
    parser.add_argument("--rss", type=int, default=0, metavar="N",
                        help="instead: N requests, the traced service's RSS growth (issue 48: "
                        "10000)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.cost:
        off, on = cost(args.cost)
        print(f"| otel: the tracing's CPU per gateway request, on the request's thread "
              f"| {on - off:.1f} us | {on:.1f} us on, {off:.1f} us off (best of 21 x {args.cost}) "
              f"| - | collector hanging, span queue {QUEUE} |")  # fmt: skip
        return 0
    if args.rss:
        with tempfile.TemporaryDirectory(prefix="ledger-otel-") as scratch:
            before, after, dropped = rss_growth(Path(scratch), args.rss)
        print(f"| otel: RSS growth over {args.rss} requests, collector hanging "
              f"| {after - before:.1f} MiB | {before:.1f} -> {after:.1f} MiB | <= 50 MiB "
              f"| dropped spans on /metrics: {dropped:.0f} |")  # fmt: skip
        return 0 if after - before <= 50 and dropped > 0 else 1
    with tempfile.TemporaryDirectory() as scratch:
        ratio, a, b, dropped = measure(Path(scratch), args.requests)
    print(f"| otel: gateway request, collector hanging / tracing off ({args.requests} pairs) "
          f"| {ratio:.3f}x | {a * 1000:.2f} ms vs {b * 1000:.2f} ms | <= {TARGET}x "
          f"| dropped spans on /metrics: {dropped:.0f} |")  # fmt: skip
    return 0 if ratio <= TARGET and dropped > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
