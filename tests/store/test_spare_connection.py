"""Issue 46 (a lean reserve and settle): on SQLite the connection of a transaction that ended
well is kept checked out for the next one (no pool checkout and return per transaction). One
that raises goes back to the pool; a forked child never uses its parent's; closing the ledger
closes it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from ledger.records import Success
from ledger.store.engine import Database
from tests.support.ledgers import LedgerFactory


def _out(db: Database) -> int:
    """Connections checked out of the pool now."""
    pool: Any = db.engine.pool
    return int(pool.checkedout())


def _driver(db: Database) -> object:
    with db.write() as txn:
        return txn.conn.connection.driver_connection


def test_issue46_a_write_after_a_write_runs_on_the_same_kept_connection(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(callsPerHour=100)
    db = led.store.db
    first = _driver(db)
    led.settle(led.reserve("s1", "alpha/small").id, Success(input_tokens=5))
    with db.read() as conn:
        assert conn.connection.driver_connection is first
        assert conn.get_execution_options().get("ledger_write") is False  # a read stays a read
    assert _driver(db) is first
    assert _out(db) == 1  # kept out of the pool between transactions


def test_issue46_a_transaction_that_raises_gives_its_connection_back(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(callsPerHour=100)
    db = led.store.db
    _driver(db)
    with pytest.raises(RuntimeError), db.write():
        raise RuntimeError("the caller's block failed")
    assert _out(db) == 0  # rolled back and returned (reset there)
    led.settle(led.reserve("s1", "alpha/small").id, Success(input_tokens=5))
    assert _out(db) == 1


def test_issue46_closing_the_ledger_closes_the_kept_connection(make_ledger: LedgerFactory) -> None:
    led = make_ledger(callsPerHour=100)
    db = led.store.db
    _driver(db)
    assert _out(db) == 1
    db.dispose()
    assert _out(db) == 0


def test_issue46_a_forked_child_never_writes_on_its_parents_connection(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(callsPerHour=100)
    db = led.store.db
    parent = id(_driver(db))
    pid = os.fork()
    if pid == 0:  # the child: its own connection, and a reserve and a settle work
        code = 1
        try:
            child = id(_driver(db))
            led.settle(led.reserve("child", "alpha/small").id, Success(input_tokens=5))
            code = 0 if child != parent else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    led.settle(led.reserve("parent", "alpha/small").id, Success(input_tokens=5))
    assert id(_driver(db)) == parent  # the parent's is untouched
