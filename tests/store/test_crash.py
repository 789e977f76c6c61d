"""SPEC 15, R-DB-3, R-RES-10a: `kill -9` at random moments never corrupts or loses a commit.

A child reserves and settles in a loop with request ids and acknowledges every commit through a
pipe; the parent SIGKILLs it at a random moment, then checks the file and the acknowledgements,
and recovers a committed-but-unacknowledged reservation by repeating its request id. Children
are forked from a forkserver that preloaded the ledger, so a round costs milliseconds, not an
interpreter start.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.store import sqlite_driver
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import TEST_CATALOG
from tests.support.procs import crash_child, write_home

ROUNDS = 120

# The contract suite (R-DB-7): the kill loop runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)


def _messages(reader: Any) -> list[tuple[Any, ...]]:
    """Everything the dead child managed to send (each message is one atomic pipe write)."""
    out: list[tuple[Any, ...]] = []
    while True:
        try:
            out.append(reader.recv())
        except EOFError:
            return out


def _kill_at_random(proc: Any, reader: Any, rng: random.Random) -> list[tuple[Any, ...]]:
    """Let the child commit a few times, then SIGKILL it a random few milliseconds later."""
    seen: list[tuple[Any, ...]] = []
    for _ in range(rng.randint(0, 8)):
        if not reader.poll(30):
            break
        seen.append(reader.recv())
    time.sleep(rng.random() * 0.012)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL
    return seen + _messages(reader)


def _stored(url: str) -> tuple[dict[str, int], set[int]]:
    """Request id -> reservation id, and the ids still open or expired, read from the database."""
    if url.startswith("sqlite"):  # a hot journal is rolled back here; the file must be sound
        with sqlite_driver.connect(url.removeprefix("sqlite:///")) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    by_request = {r[0]: r[1] for r in rows(url, "SELECT request_id, id FROM reservations")}
    open_ids = {r[0] for r in rows(
        url, "SELECT id FROM reservations WHERE status IN ('open', 'expired')")}
    return by_request, open_ids


def test_spec_15_kill_9_never_loses_a_committed_reservation(
    tmp_path: Path, ledger_db: str | None
) -> None:
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, callsPerHour=1_000_000, sourceCalls=1_000)
    parent = Ledger.open(home, ledger_db, env={})
    url = db_url(home, ledger_db)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.support.procs"])
    rng = random.Random(20270115)
    acked: dict[str, int] = {}  # request id -> reservation id, acknowledged by the child
    intents: set[str] = set()
    recovered = replayed_new = 0
    started = time.monotonic()
    for round_no in range(ROUNDS):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=crash_child, args=(str(home), round_no, writer), kwargs={"db": ledger_db}
        )
        proc.start()
        writer.close()
        messages = _kill_at_random(proc, reader, rng)
        reader.close()

        stored, open_ids = _stored(url)
        pending: tuple[str, str, str] | None = None
        for message in messages:
            if message[0] == "intent":
                intents.add(message[1])
                pending = (message[1], message[2], message[3])
            elif message[0] == "reserved":
                acked[message[1]] = message[2]
                pending = None
            else:
                assert message[1] not in open_ids  # an acknowledged settle stuck
        # every acknowledged reservation is present once, under its own request id
        assert {rid: stored.get(rid) for rid in acked} == acked
        # no row appears that no caller asked for
        assert set(stored) <= intents
        if pending is not None:
            request_id, source, model = pending
            again = parent.reserve(source, model, request_id=request_id)
            if request_id in stored:  # committed, never acknowledged: R-RES-10a recovers it
                assert again.replayed
                assert again.id == stored[request_id]
                recovered += 1
            else:
                assert not again.replayed
                replayed_new += 1
            acked[request_id] = again.id
    elapsed = time.monotonic() - started
    total = rows(url, "SELECT count(*) FROM reservations")[0][0]
    parent.close()
    assert total == len(acked)  # nothing lost, nothing counted twice
    assert recovered >= 1, "no kill landed between a commit and its acknowledgement"
    print(  # figures for the README reliability section (pytest -s shows them)
        f"crash: {ROUNDS} kills survived, {total} reservations, {recovered} recovered by "
        f"request id, {replayed_new} re-reserved, {elapsed:.1f}s"
    )
