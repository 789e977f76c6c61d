"""Figure `client` (issue 46): one `LedgerClient` reserve+settle ÷ the in-process cycle (<= 2.0),
by two methods in the same run, against the same service and the same in-process ledger.

- chunks: the sides alternate every 10 cycles (`bench/service.py`'s method, the README's 1.77x):
  each side's cycles run right after the other side's, so whatever one side leaves behind (the
  other file's commits still being written back by the disk, caches and CPU time taken by the
  other process) is paid by both alike;
- blocks: each side runs its whole run (`settings.cycles`) in one block, then the other side
  (what an independent measurement of each does: the 2.24x of the issue's quiet run).

Both methods alternate per run (chunks, blocks, chunks, ...), and every side's absolute time is
reported, so the note can say which side moves between the methods and by how much.

Invariant: the service is a real `ledger serve` subprocess on a state directory of its own; both
ledgers are fresh, migrated, and use the bench policy and catalog, on the same disk.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from bench.common import (
    CHUNK,
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
)
from bench.service import CLIENT_TARGET, _service_home
from ledger.client import LedgerClient
from tests.support.serving import running


def _measure(root: Path, settings: Settings, socket: Path) -> dict[str, tuple[list[float],
                                                                              list[float]]]:
    """Per method, per run: (in-process seconds per cycle, client seconds per cycle)."""
    ledger = open_ledger(make_home(root, "client-inproc"))
    client = LedgerClient(socket)
    out: dict[str, tuple[list[float], list[float]]] = {"chunks": ([], []), "blocks": ([], [])}
    one_run = replace(settings, runs=1)

    def remote(start: int, count: int) -> float:
        return per_cycle(lambda i: ledger_cycle(client, i, prefix="cl"), start, count)

    try:
        warm = max(3, settings.cycles // 10)
        per_cycle(lambda i: ledger_cycle(ledger, i), 0, warm)
        remote(0, warm)
        offset = warm
        for _ in range(settings.runs):
            for method, chunk in (("chunks", CHUNK), ("blocks", settings.cycles)):
                inproc, over = side_by_side(cycles_of(ledger), remote, one_run, offset, chunk)
                out[method][0].extend(inproc)
                out[method][1].extend(over)
                offset += settings.cycles
    finally:
        client.close()
        ledger.close()
    return out


def run(root: Path, settings: Settings) -> list[Row]:
    """The client/in-process ratio by both methods, each side's time, and why they differ."""
    # a unix socket path must stay short: the service's state directory lives under /tmp
    with tempfile.TemporaryDirectory(prefix="ledger-cl-") as short:
        home = _service_home(Path(short), "svc")
        open_ledger(home).close()  # migrated before the service starts
        with running(home) as served:
            measured = _measure(root, settings, served.socket)
    rows: list[Row] = []
    medians: dict[str, tuple[float, float]] = {}
    for method, label in (("chunks", f"alternating every {CHUNK} cycles"),
                          ("blocks", f"each side's {settings.cycles} cycles in one block")):
        inproc, over = measured[method]
        ratio = Stats.of([o / i for o, i in zip(over, inproc, strict=True)])
        a, b = Stats.of(inproc), Stats.of(over)
        medians[method] = (a.median, b.median)
        rows.append(ratio_row(
            f"client: LedgerClient cycle / in-process cycle, {label}", ratio,
            f"<= {CLIENT_TARGET:.1f}", ratio.median <= CLIENT_TARGET,
            note=f"in-process {ms(a.median)} (±{a.spread_pct():.0f}%), client {ms(b.median)} "
                 f"(±{b.spread_pct():.0f}%)",
        ))
    (ci, cc), (bi, bc) = medians["chunks"], medians["blocks"]
    rows.append(Row(
        "client: blocks / chunks, each side's time", f"in-process {bi / ci:.2f}x, "
        f"client {bc / cc:.2f}x", f"n={settings.runs}",
        note="blocks ratio / chunks ratio = the client's change / the in-process change "
             "(in --quick both methods are the same 10-cycle alternation)",
    ))
    return rows
