"""Issue 46 (a lean reserve and settle): once warm, a reserve and a settle run statements their
SQLite connection has already compiled. The driver's statement cache puts a new statement last,
where the next miss evicts it: with the cache filled (a new ledger's migration fills the
driver's default), the cycle's statements evicted one another and were compiled again on every
run. SQLite asks the authorizer only while it compiles a statement, so counting its calls counts
compilations."""

from __future__ import annotations

from sqlalchemy import text

from ledger.records import Success
from ledger.store.engine import STATEMENT_CACHE
from tests.support.ledgers import LedgerFactory

_TRANSACTION = 22  # SQLITE_TRANSACTION: the authorizer's action code for BEGIN / COMMIT


def test_issue46_a_warm_reserve_and_settle_compile_no_statement(
    make_ledger: LedgerFactory,
) -> None:
    led = make_ledger(callsPerHour=1000)  # a new ledger: its migration ran on this connection
    db = led.store.db
    with db.engine.connect() as conn:
        # ledger statements of other kinds fill more of the cache first (a busy process's mix)
        for n in range(150):
            conn.execute(text(f"SELECT {n} FROM clock"))
        conn.rollback()
        raw = conn.connection.driver_connection
        assert raw is not None
        compiled: list[str | None] = []

        def authorizer(action: int, arg: str | None, *_: str | None) -> int:
            if action != _TRANSACTION:  # the driver's commit() compiles its COMMIT each time
                compiled.append(arg)
            return 0  # SQLITE_OK

        raw.set_authorizer(authorizer)  # expires every prepared statement once
    for n in range(6):  # warm (new sources, then known ones): each statement compiled once
        led.settle(led.reserve(f"s{n % 3}", "alpha/small").id, Success(input_tokens=5))
    compiled.clear()
    for n in range(6, 12):
        led.settle(led.reserve(f"s{n % 3}", "alpha/small").id, Success(input_tokens=5))
    assert compiled == []
    assert STATEMENT_CACHE >= 1024
