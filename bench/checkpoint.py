"""Figure `checkpoint` (issue 46 item 2): WAL checkpoints under a status reader.

N reserve+settle cycles on one ledger (WAL, synchronous=FULL) while another process builds the
status document (`build_status`, what `ledger status --json` prints) in a loop throughout. Each
cycle is timed; right after it the bench reads the log's header and the shared index (plain file
reads, no SQLite connection: nothing here opens the database but the ledger itself). A cycle met
a checkpoint when the index's backfill count rose (frames copied into the database: the work of a
checkpoint, done by the committing writer), or the log was restarted (the header's salt changed,
or the index's frame count dropped). Rows: p99 of those cycles / p99 of the others (<= 2.0), and
the -wal file's largest and final size (<= 8 MiB).

Invariant: the reader is a separate process that is reading before the first measured cycle and
until after the last; both cycle populations come from the same run; the scratch ledger lives
under the bench's temporary directory.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import struct
import sys
import time
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from bench.common import Row, Settings, ledger_cycle, make_home, ms, open_ledger
from bench.contention import percentile
from ledger.store import sqlite_driver
from ledger.store.engine import chosen_journal_mode

FULL_CYCLES = 100_000
QUICK_CYCLES = 2_000
RATIO_TARGET = 2.0
WAL_TARGET_MIB = 8.0
TRUNCATE_ABOVE_MIB = 4.0  # the candidate fix's threshold (run_truncating)
TRUNCATE_BUSY_MS: int | None = None  # its wait for readers; None: the policy's busy timeout
MIB = 1024 * 1024


@dataclass(frozen=True)
class WalState:
    """What the -wal and -shm files say after a cycle."""

    size: int  # bytes of the -wal file
    salt: bytes  # WAL header bytes 16-23: new at every restart of the log
    frames: int  # the index's mxFrame: frames in the log now
    backfilled: int  # the index's nBackfill: frames already copied into the database


def _pread(path: Path, count: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    try:
        return os.pread(fd, count, 0)
    finally:
        os.close(fd)


def wal_state(db: Path) -> WalState:
    """The log's size and salt, and the shared index's frame and backfill counts (the -shm
    file's header: mxFrame at byte 16, nBackfill at byte 96, in the machine's byte order)."""
    wal = Path(f"{db}-wal")
    try:
        size = wal.stat().st_size
    except FileNotFoundError:
        size = 0
    salt = _pread(wal, 24)[16:24]
    shm = _pread(Path(f"{db}-shm"), 100)
    frames = backfilled = 0
    if len(shm) >= 100:
        (frames,) = struct.unpack_from("=I", shm, 16)
        (backfilled,) = struct.unpack_from("=I", shm, 96)
    return WalState(size, salt, frames, backfilled)


def met_checkpoint(before: WalState, after: WalState) -> bool:
    """Whether a checkpoint (or the log's restart after one) happened between two looks."""
    restarted = after.salt != before.salt or after.frames < before.frames
    return restarted or after.backfilled > before.backfilled


def _reader(home: str, ready: Event, stop: Event, out: Queue[Any]) -> None:
    """Build the status document in a loop until told to stop; report count and latencies."""
    from ledger.status.document import build_status  # lazy: only the reader process needs it

    ledger = open_ledger(Path(home))
    latencies: list[float] = []
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            build_status(ledger)
            latencies.append(time.perf_counter() - t0)
            ready.set()
    finally:
        ledger.close()
        ready.set()
        out.put(latencies)


@dataclass
class Trace:
    """Per-cycle latencies split by whether the cycle met a checkpoint, and the log's sizes."""

    met: list[float]
    others: list[float]
    sizes: list[int]  # the -wal size after each cycle
    restarts: int


def _cycles(home: Path, count: int, truncate_above: int | None = None) -> Trace:
    db = home / "ledger.db"
    ledger = open_ledger(home)
    side = None
    if truncate_above is not None:  # the candidate fix: the writer truncates a long log
        side = sqlite_driver.connect(db, isolation_level=None)
        wait = ledger.policy.busy_timeout_ms if TRUNCATE_BUSY_MS is None else TRUNCATE_BUSY_MS
        side.execute(f"PRAGMA busy_timeout = {wait}")
    trace = Trace([], [], [], 0)
    try:
        for i in range(20):  # warm: the statements are prepared, the log exists
            ledger_cycle(ledger, i, prefix="warm")
        before = wal_state(db)
        for i in range(count):
            t0 = time.perf_counter()
            ledger_cycle(ledger, i)
            if side is not None and truncate_above is not None and before.size > truncate_above:
                side.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            took = time.perf_counter() - t0
            after = wal_state(db)
            (trace.met if met_checkpoint(before, after) else trace.others).append(took)
            trace.restarts += after.salt != before.salt
            trace.sizes.append(after.size)
            before = after
            if (i + 1) % max(1, count // 10) == 0:
                print(f"  checkpoint: {i + 1:,} cycles, -wal {after.size / MIB:.1f} MiB",
                      file=sys.stderr, flush=True)
    finally:
        if side is not None:
            side.close()
        ledger.close()
    return trace


def _measure(home: Path, count: int, truncate_above: int | None) -> tuple[Trace, list[float]]:
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    out: Queue[Any] = ctx.Queue()
    reader = ctx.Process(target=_reader, args=(str(home), ready, stop, out))
    reader.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the status reader did not start")
        trace = _cycles(home, count, truncate_above)
    finally:
        stop.set()
    reads: list[float] = out.get(timeout=120)
    reader.join(60)
    return trace, reads


def run(root: Path, settings: Settings) -> list[Row]:
    """The checkpoint tail ratio and the -wal file's size, with a status reader throughout."""
    return _run(root, settings, None)


def run_truncating(root: Path, settings: Settings) -> list[Row]:
    """The same with a candidate fix (not the store's behaviour): after any cycle that leaves
    the -wal file above TRUNCATE_ABOVE_MIB, the writer runs `PRAGMA wal_checkpoint(TRUNCATE)`
    on a connection of its own (it waits, up to the busy timeout, for the reader's snapshot to
    end); that wait is counted in the cycle's time."""
    return _run(root, settings, int(TRUNCATE_ABOVE_MIB * MIB))


def _run(root: Path, settings: Settings, truncate_above: int | None) -> list[Row]:
    mode = chosen_journal_mode()
    if mode != "wal":
        return [Row("checkpoint: WAL under a status reader", "skipped", "",
                    note=f"the linked SQLite runs journal mode `{mode}`, not WAL (R-DB-3a)")]
    count = QUICK_CYCLES if settings.quick else FULL_CYCLES
    home = make_home(root, "checkpoint")
    open_ledger(home).close()
    t0 = time.perf_counter()
    trace, reads = _measure(home, count, truncate_above)
    wall = time.perf_counter() - t0
    rows = [_tail_row(trace, count), _size_row(trace, count), _reader_row(reads, wall)]
    if truncate_above is None:
        return rows
    label = f"checkpoint (candidate: writer's checkpoint(TRUNCATE) above {TRUNCATE_ABOVE_MIB} MiB)"
    return [Row(r.figure.replace("checkpoint", label, 1), r.value, r.spread, r.target, r.met,
                r.note) for r in rows]


def _tail_row(trace: Trace, count: int) -> Row:
    figure = f"checkpoint: p99 of the {count:,} cycles that met a checkpoint / p99 of the others"
    if not trace.met or not trace.others:
        return Row(figure, "n/a", "", f"<= {RATIO_TARGET:.1f}", False,
                   note=f"{len(trace.met)} cycles met a checkpoint: nothing to compare")
    met99, other99 = percentile(trace.met, 0.99), percentile(trace.others, 0.99)
    ratio = met99 / other99
    note = (f"met {ms(met99)} (p50 {ms(statistics.median(trace.met))}, max "
            f"{ms(max(trace.met))}); others {ms(other99)} (p50 "
            f"{ms(statistics.median(trace.others))}); {trace.restarts} log restarts")
    return Row(figure, f"{ratio:.2f}x", f"n={len(trace.met)} met, {len(trace.others)} others",
               f"<= {RATIO_TARGET:.1f}", ratio <= RATIO_TARGET, note)


def _size_row(trace: Trace, count: int) -> Row:
    largest, end = max(trace.sizes) / MIB, trace.sizes[-1] / MIB
    quarters = ", ".join(f"{trace.sizes[min(count - 1, q * count // 4)] / MIB:.1f}"
                         for q in (1, 2, 3))
    return Row(
        f"checkpoint: -wal file size after {count:,} cycles with a status reader",
        f"max {largest:.2f} MiB, end {end:.2f} MiB", "n=1",
        f"<= {WAL_TARGET_MIB:.0f} MiB", max(largest, end) <= WAL_TARGET_MIB,
        note=f"at 1/4, 1/2, 3/4 of the run: {quarters} MiB",
    )


def _reader_row(reads: list[float], wall: float) -> Row:
    if not reads:
        return Row("checkpoint: the status reader", "no reads", "", note="the reader failed")
    return Row("checkpoint: status reads beside the cycles (the reader process)",
               f"{len(reads) / wall:.1f}/s", f"n={len(reads)}",
               note=f"build_status p50 {ms(statistics.median(reads))}, max {ms(max(reads))}")
