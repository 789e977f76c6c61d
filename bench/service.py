"""Figure `service`: `ledger serve` against the library in one run (issue 21).

- a `LedgerClient` reserve+settle over the unix socket ÷ the in-process `Ledger` cycle (≤ 2.0),
  measured side by side in chunks;
- a `ledger reserve` + `ledger settle` CLI pair ÷ the same pair through `curl --unix-socket`
  (≥ 50: what a shell cron job saves by talking to the service), with what bounds it: curl's own
  start-up (`curl --version`, twice a pair) and the service's time for the pair (its own latency
  histogram: from the request's arrival to its answer, the durable commit included);
- 8 client processes through one service ÷ one in-process client: total throughput (≥ 0.9) and
  the reserve tail (p99 of the 8 <= 2 x 8 x p50 of the one), rounds interleaved.

Invariant: the service is a real `ledger serve` subprocess on a state directory of its own; every
side's ledger is fresh, migrated and uses the bench policy and catalog.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import (
    Row,
    Settings,
    Stats,
    cycles_of,
    ledger_cycle,
    make_home,
    ms,
    open_ledger,
    per_cycle,
    ratio_row,
    side_by_side,
    time_row,
)
from bench.common import bench_policy as policy_of_bench
from bench.contention import percentile, run_round
from ledger.client import LedgerClient
from tests.support.serving import Served, running

CLIENT_TARGET = 2.0
CLI_TARGET = 50.0
FLEET_TARGET = 1.5  # issue 46: group commit in WAL
TAIL_TARGET = 2.0
CLIENTS = 8
QUICK_CLIENTS = 2


def _service_home(root: Path, name: str) -> Path:
    home = make_home(root, name)
    (home / "recovery.json").write_text(json.dumps(policy_of_bench().to_json()))
    return home


def _client_rows(root: Path, settings: Settings, socket: Path) -> list[Row]:
    ledger = open_ledger(make_home(root, "svc-inproc"))
    client = LedgerClient(socket)
    try:
        warm = max(3, settings.cycles // 10)
        per_cycle(lambda i: ledger_cycle(ledger, i), 0, warm)
        per_cycle(lambda i: ledger_cycle(client, i, prefix="cl"), 0, warm)
        inproc, over = side_by_side(
            cycles_of(ledger),
            lambda start, count: per_cycle(lambda i: ledger_cycle(client, i, prefix="cl"), start,
                                           count),
            settings, warm,
        )
    finally:
        client.close()
        ledger.close()
    ratio = Stats.of([o / i for o, i in zip(over, inproc, strict=True)])
    return [
        time_row("service: LedgerClient reserve+settle over the socket", Stats.of(over)),
        ratio_row("service: LedgerClient cycle / in-process cycle", ratio,
                  f"<= {CLIENT_TARGET:.1f}", ratio.median <= CLIENT_TARGET),
    ]


def _cli_pair(home: Path, i: int) -> None:
    base = [sys.executable, "-m", "ledger", "--home", str(home)]
    out = subprocess.run([*base, "reserve", f"cli-{i}", "--model", "alpha/m0", "--json"],
                         capture_output=True, text=True, check=True, timeout=120)
    rid = str(json.loads(out.stdout)["id"])
    subprocess.run([*base, "settle", rid, "--ok", "--json"], capture_output=True, check=True,
                   timeout=120)


def _curl_pair(curl: str, socket: Path, i: int) -> None:
    base = [curl, "-sf", "--unix-socket", str(socket), "-X", "POST"]
    body = json.dumps({"source": f"curl-{i}", "model": "alpha/m0"})
    out = subprocess.run([*base, "http://ledger/v1/reserve", "-d", body], capture_output=True,
                         text=True, check=True, timeout=120)
    settle = json.dumps({"reservation": json.loads(out.stdout)["id"],
                         "outcome": {"result": "success"}})
    subprocess.run([*base, "http://ledger/v1/settle", "-d", settle], capture_output=True,
                   check=True, timeout=120)


_SERVED = re.compile(
    r"^ledger_http_request_duration_seconds_sum"
    r'\{method="POST",route="/v1/(?:reserve|settle)"\} (\S+)$',
    re.MULTILINE,
)


def _served_s(client: httpx.Client) -> float:
    """Seconds the service has spent answering reserves and settles so far (its histogram)."""
    text = client.get("/metrics").text
    return sum(float(m.group(1)) for m in _SERVED.finditer(text))


def _curl_start_s(curl: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([curl, "--version"], capture_output=True, check=True, timeout=120)
    return time.perf_counter() - t0


def _cli_rows(settings: Settings, home: Path, served: Served) -> list[Row]:
    socket = served.socket
    curl = shutil.which("curl")
    if curl is None:
        return [Row("service: CLI pair / curl pair", "skipped", "", note="no curl on PATH")]
    pairs = 1 if settings.quick else 3
    cli_s: list[float] = []
    curl_s: list[float] = []
    served_s: list[float] = []
    start_s: list[float] = []
    n = 0
    with served.client() as metrics:
        for _ in range(settings.runs):
            t0 = time.perf_counter()
            for _ in range(pairs):
                _cli_pair(home, n)
                n += 1
            cli_s.append((time.perf_counter() - t0) / pairs)
            before = _served_s(metrics)
            t0 = time.perf_counter()
            for _ in range(pairs):
                _curl_pair(curl, socket, n)
                n += 1
            curl_s.append((time.perf_counter() - t0) / pairs)
            served_s.append((_served_s(metrics) - before) / pairs)
            start_s.append(statistics.median(_curl_start_s(curl) for _ in range(pairs)))
    ratio = Stats.of([c / u for c, u in zip(cli_s, curl_s, strict=True)])
    ceiling = Stats.of([c / (2 * s) for c, s in zip(cli_s, start_s, strict=True)])
    return [
        time_row("service: ledger reserve + settle CLI pair", Stats.of(cli_s)),
        time_row("service: the same pair through curl --unix-socket", Stats.of(curl_s)),
        time_row("service: of which the service's own time (arrival to answer, x2)",
                 Stats.of(served_s)),
        time_row("service: curl start-up alone (curl --version, once)", Stats.of(start_s)),
        ratio_row("service: CLI pair / curl pair", ratio, f">= {CLI_TARGET:.0f}",
                  ratio.median >= CLI_TARGET),
        ratio_row("service: CLI pair / 2 curl start-ups (ceiling: an instant service)", ceiling,
                  "", None),
    ]


def _fleet_rows(
    root: Path, settings: Settings, socket: Path, label: str = "service"
) -> list[Row]:
    """The 8-client rows (`label` names the figure: `service-slow-sync` reuses them)."""
    home = make_home(root, f"{label}-one")
    open_ledger(home).close()
    clients = QUICK_CLIENTS if settings.quick else CLIENTS
    runs = 1 if settings.quick else max(1, settings.runs - 2)
    rates: list[tuple[float, float]] = []
    tails: list[float] = []
    pooled: list[float] = []
    for r in range(runs):
        one, one_lat = run_round(home, 1, settings.contention_s, f"one{r}")
        many, many_lat = run_round(home, clients, settings.contention_s, f"svc{r}",
                                   server=str(socket))
        rates.append((many, one))
        tails.append(percentile(many_lat, 0.99) / (clients * percentile(one_lat, 0.5)))
        pooled.extend(many_lat)
    rel = Stats.of([m / o for m, o in rates])
    tail = Stats.of(tails)
    note = f"{Stats.of([m for m, _ in rates]).median:.0f}/s; reserve p50 " \
        f"{ms(percentile(pooled, 0.5))}, p99 {ms(percentile(pooled, 0.99))}"
    return [
        ratio_row(f"{label}: {clients} client processes, total cycles/s vs 1 in-process", rel,
                  f">= {FLEET_TARGET}", rel.median >= FLEET_TARGET,
                  note=f"{note}; 1 in-process {Stats.of([o for _, o in rates]).median:.0f}/s"),
        ratio_row(f"{label}: {clients} clients, reserve p99 / ({clients} x in-process p50)", tail,
                  f"<= {TAIL_TARGET:.1f}", tail.median <= TAIL_TARGET),
    ]


def run(root: Path, settings: Settings) -> list[Row]:
    """All three service figures against one running service."""
    # a unix socket path must stay short: the service's state directory lives under /tmp
    with tempfile.TemporaryDirectory(prefix="ledger-svc-") as short:
        home = _service_home(Path(short), "svc")
        open_ledger(home).close()  # migrated before the service starts
        with running(home) as served:
            rows = _client_rows(root, settings, served.socket)
            rows += _cli_rows(settings, home, served)
            rows += _fleet_rows(root, settings, served.socket)
    return rows
