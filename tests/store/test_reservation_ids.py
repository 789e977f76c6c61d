"""Issue 20 item 9, R-DB-7: a reservation id no row can have is an unknown reservation, on both
backends alike (exit 2 from the CLI, `NotFoundError` / `UsageError` from the API).

PostgreSQL's `integer` id column made `settle 2147483648` a "database error" (exit 4) while
SQLite answered "unknown reservation" (exit 2); ids past SQLite's 64-bit range reached the driver.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.errors import NotFoundError, UsageError
from ledger.records import Success
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import LedgerFactory

pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)

BIG_IDS = [2**31, 2**31 + 1, 2**62, 2**63, 2**70]


def _count(home: Path, ledger_db: str | None) -> int:
    return int(rows(db_url(home, ledger_db), "SELECT count(*) FROM reservations")[0][0])


def test_issue20_9_settle_an_id_past_any_row_is_unknown_reservation_exit_2(
    home: Path, ledger_db: str | None, make_ledger: LedgerFactory
) -> None:
    led = make_ledger()
    led.reserve("s1", "alpha/small")
    runner = CliRunner()
    for big in (2**31, 2**62):  # the CLI's own range stops at 2**62
        result = runner.invoke(cli, ["--home", str(home), "settle", str(big), "--ok"])
        assert result.exit_code == 2, result.output
        assert result.output.splitlines() == ["ledger: unknown reservation"]
    for big in BIG_IDS:
        with pytest.raises(NotFoundError, match="unknown reservation"):
            led.settle(big, Success(input_tokens=1, output_tokens=1))
    assert _count(home, ledger_db) == 1  # nothing written


def test_issue20_9_after_an_id_past_any_row_names_no_reservation_exit_2(
    home: Path, ledger_db: str | None, make_ledger: LedgerFactory
) -> None:
    led = make_ledger()
    led.reserve("s1", "alpha/small")
    result = CliRunner().invoke(
        cli, ["--home", str(home), "reserve", "s1", "--model", "alpha/small",
              "--after", str(2**31)],
    )
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == ["ledger: after names no reservation of this source"]
    for big in BIG_IDS:
        with pytest.raises(UsageError, match="after names no reservation of this source"):
            led.reserve("s1", "beta/mid", after=big)
    assert _count(home, ledger_db) == 1  # nothing written
