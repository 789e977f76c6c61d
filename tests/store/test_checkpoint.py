"""WAL checkpoints off the reserve path (R-DB-3, issue 46 item 2): a thread copies the log, a long
read starts its snapshot where the log can start over, and the log stays bounded while a reader
reads back to back; no reserve waits for a copy or for a reader.

The log is watched through its files, as the bench does (nothing here opens a second SQLite
connection to judge it): the -wal header's salt is new at every start-over, and the index header
in the -shm file holds the frames in the log (`mxFrame`, byte 16) and those already copied
(`nBackfill`, byte 96), in the machine's byte order (sqlite.org/walformat.html)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from ledger.api import Ledger
from ledger.records import Success
from ledger.store import checkpoint, sqlite_driver
from ledger.store.schema import reservations
from ledger.store.status_views import status_data
from tests.support.ledgers import write_policy

ROOT = Path(__file__).resolve().parent.parent.parent


def needs_wal() -> None:
    if sqlite_driver.LIBRARY != "pysqlite3":
        if os.environ.get("CI") == "true":
            pytest.fail("CI must install the pysqlite3 wheel (pyproject's platform marker)")
        pytest.skip("no pysqlite3 wheel on this platform: the rollback journal has no WAL")


@dataclass(frozen=True)
class Log:
    salt: bytes
    frames: int
    copied: int
    size: int


def log_of(home: Path) -> Log:
    wal, shm = home / "ledger.db-wal", home / "ledger.db-shm"
    with open(wal, "rb") as fh:
        salt = fh.read(24)[16:24]
    with open(shm, "rb") as fh:
        header = fh.read(100)
    (frames,) = struct.unpack_from("=I", header, 16)
    (copied,) = struct.unpack_from("=I", header, 96)
    return Log(salt, frames, copied, wal.stat().st_size)


def cycle(led: Ledger, i: int) -> None:
    res = led.reserve(f"s{i}", "alpha/small")
    led.settle(res.id, Success(input_tokens=1, output_tokens=1))


def count(conn: Any) -> int:
    return int(conn.execute(select(func.count()).select_from(reservations)).scalar_one())


@pytest.fixture
def wal_ledger(home: Path) -> Iterator[Ledger]:
    needs_wal()
    write_policy(home, defaultModel="alpha/small", callsPerHour=1_000_000)
    led = Ledger.open(home, env={})
    try:
        yield led
    finally:
        led.close()


def grow_past_restart(led: Ledger, home: Path) -> None:
    i = 0
    while log_of_or_none(home) is None or log_of(home).frames < checkpoint.RESTART_FRAMES + 20:
        cycle(led, i)
        i += 1
        assert i < 500


def log_of_or_none(home: Path) -> Log | None:
    return log_of(home) if (home / "ledger.db-shm").exists() else None


@pytest.mark.parametrize("long", [True, False])
def test_r_db_3_a_long_read_lets_the_log_start_over_while_it_reads(
    wal_ledger: Ledger, home: Path, monkeypatch: pytest.MonkeyPatch, long: bool
) -> None:
    """A long read begun on a long log begins on a fully copied one: the next commit starts the
    log over while that read goes on, and the read still sees its own snapshot. A plain read
    (the contrast) holds the log: it only grows."""
    monkeypatch.setattr(checkpoint, "COPY_EVERY", 10**9)  # no background copy: the read alone
    led = wal_ledger
    grow_past_restart(led, home)
    before = log_of(home)
    assert before.copied < before.frames  # nothing copied it yet
    with led.db.read(long=long) as conn:
        seen = count(conn)
        cycle(led, 1000)  # another connection commits while the read is open
        after = log_of(home)
        assert count(conn) == seen  # the snapshot holds
    with led.db.read() as conn:
        assert count(conn) == seen + 1
    if long:
        assert after.salt != before.salt  # started over
        assert after.frames < before.frames
    else:
        assert after.salt == before.salt
        assert after.frames > before.frames


def test_r_db_3_the_log_stays_bounded_while_status_is_read_back_to_back(
    wal_ledger: Ledger, home: Path
) -> None:
    """A thread builds the status picture without a pause (never leaving a gap between its
    snapshots) while 200 cycles commit about 3,000 frames: the log starts over again and again
    and the -wal file stays far below the size it reaches when nothing starts it over."""
    led = wal_ledger
    stop = threading.Event()
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            status_data(led.db, led.policy.calls_per_hour, led.policy)
            reads[0] += 1

    thread = threading.Thread(target=reader)
    cycle(led, 0)
    thread.start()
    salts, largest, frames = set(), 0, 0
    try:
        for i in range(1, 200):
            cycle(led, i)
            log = log_of(home)
            salts.add(log.salt)
            largest = max(largest, log.size)
            frames = max(frames, log.frames)
    finally:
        stop.set()
        thread.join()
    assert reads[0] > 0
    assert len(salts) > 2, (reads[0], frames)  # started over, more than once
    assert largest < checkpoint.SIZE_LIMIT  # about 12 MiB if it never started over


def test_r_db_3_reserves_commit_while_a_copy_runs(
    wal_ledger: Ledger, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background copy holds no lock a writer needs: with the copy stuck in the middle,
    reserves and settles go on committing."""
    monkeypatch.setattr(checkpoint, "COPY_EVERY", 1)
    inside, release = threading.Event(), threading.Event()
    real = checkpoint.passive

    def stuck(conn: Any) -> checkpoint.Result:
        if threading.current_thread().name == "ledger-checkpoint":
            inside.set()
            release.wait(60)
        return real(conn)

    monkeypatch.setattr(checkpoint, "passive", stuck)
    led = wal_ledger
    try:
        cycle(led, 0)
        assert inside.wait(30)
        for i in range(1, 30):
            cycle(led, i)  # committed with the copy still in progress
        assert not release.is_set()
    finally:
        release.set()
    with led.db.read() as conn:
        assert count(conn) == 30


def test_r_db_3_only_a_long_read_on_a_long_log_takes_a_turn_on_the_write_lock(
    wal_ledger: Ledger, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy thread never takes the write lock (40 cycles, a copy after every commit: the
    lock's turns are exactly the 80 writes); a long read takes one turn when the log is long
    (to begin on a fully copied log), none when it is short; a plain read never does."""
    monkeypatch.setattr(checkpoint, "COPY_EVERY", 1)
    led = wal_ledger
    ckpt = led.db.checkpointer
    assert ckpt is not None
    cycle(led, 0)
    turns = led.db.write_lock.turns()
    assert turns is not None
    copies = ckpt.copies
    for i in range(1, 41):
        cycle(led, i)
    for _ in range(600):  # the thread copies after the wakes (ordering, not time)
        if ckpt.copies > copies + 5:
            break
        threading.Event().wait(0.05)
    assert ckpt.copies > copies + 5
    assert led.db.write_lock.turns() == turns + 80
    ckpt.close()  # the thread stops: no copy of its own runs beside the reads below
    grow_past_restart(led, home)
    turns = led.db.write_lock.turns()
    assert turns is not None
    with led.db.read() as conn:
        count(conn)
    assert led.db.write_lock.turns() == turns
    with led.db.read(long=True) as conn:
        count(conn)
    assert led.db.write_lock.turns() == turns + 1  # the log was long
    cycle(led, 1000)  # its first write starts the log over
    with led.db.read(long=True) as conn:
        count(conn)
    assert led.db.write_lock.turns() == turns + 3  # the two writes; the log is short: no turn


def test_r_db_3_without_readers_the_copy_thread_starts_the_log_over(
    wal_ledger: Ledger, home: Path
) -> None:
    """A writer alone: the log starts over and stays within the fallback (the writers' own
    checkpoint at 2,048 frames, plus the cycle that crossed it). The thread's copies run
    meanwhile; one that ends between two commits lets the next start the log over earlier, but
    a writer back to back leaves few such moments (a loaded machine fewer still), so that is
    not asserted: ordering, not timing."""
    led = wal_ledger
    salts, frames = set(), 0
    for i in range(150):  # about 3,000 frames
        cycle(led, i)
        log = log_of(home)
        salts.add(log.salt)
        frames = max(frames, log.frames)
    assert len(salts) > 1
    assert frames <= checkpoint.FALLBACK_FRAMES + 100  # never the 3,000 of no restart
    ckpt = led.db.checkpointer
    assert ckpt is not None
    assert ckpt.copies > 0


def test_r_db_3_connections_keep_synchronous_full_and_the_fallback(wal_ledger: Ledger) -> None:
    with wal_ledger.db.read() as conn:
        pragma = conn.exec_driver_sql
        assert pragma("PRAGMA journal_mode").scalar() == "wal"
        assert pragma("PRAGMA synchronous").scalar() == 2  # FULL
        assert pragma("PRAGMA wal_autocheckpoint").scalar() == checkpoint.FALLBACK_FRAMES
        assert pragma("PRAGMA journal_size_limit").scalar() == checkpoint.SIZE_LIMIT


def test_r_db_3_close_stops_the_copy_thread(home: Path) -> None:
    needs_wal()
    write_policy(home, defaultModel="alpha/small", callsPerHour=1000)
    led = Ledger.open(home, env={})
    cycle(led, 0)  # a few commits (a one-shot command's): no thread yet
    assert not any(t.name == "ledger-checkpoint" for t in threading.enumerate())
    for i in range(1, checkpoint.COPY_EVERY):
        cycle(led, i)
    assert any(t.name == "ledger-checkpoint" for t in threading.enumerate())
    led.close()
    assert not any(
        t.name == "ledger-checkpoint" and t.is_alive() for t in threading.enumerate()
    )


_WRITER = """
import sys
from ledger.api import Ledger
from ledger.records import Success
led = Ledger.open(sys.argv[1], env={})
for i in range(int(sys.argv[2])):
    res = led.reserve(f"{sys.argv[3]}-{i}", "alpha/small")
    led.settle(res.id, Success(input_tokens=1, output_tokens=1))
led.close()
"""


def test_r_db_3_processes_copy_and_start_the_log_over_safely_together(home: Path) -> None:
    """Two writer processes (each with its copy thread) and this one reading status back to
    back: every reservation is there once and the file is sound."""
    needs_wal()
    write_policy(home, defaultModel="alpha/small", callsPerHour=1_000_000)
    led = Ledger.open(home, env={})
    cycle(led, 0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(home), "150", f"p{n}"], env=env)
        for n in range(2)
    ]
    try:
        while any(w.poll() is None for w in writers):
            status_data(led.db, led.policy.calls_per_hour, led.policy)
    finally:
        for w in writers:
            w.wait(120)
    assert [w.returncode for w in writers] == [0, 0]
    with led.db.read() as conn:
        assert count(conn) == 301
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    led.close()
