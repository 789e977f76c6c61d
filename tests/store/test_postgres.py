"""Issue 16, R-DB-7, R-DB-3b, R-HOME-2: what only the PostgreSQL backend does.

The shared behaviour (race, kill loop, policy scenarios, status, migrations) is the contract suite,
parametrized over both backends in its own modules. Here: the write helper takes the ledger's
advisory lock before it reads the server's clock, a held lock ends in `busy` (exit 4) with nothing
written, hosts with skewed clocks stamp the server's time, and a bad or unreachable URL is one line
with exit 2 or 4 that never shows the password.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, event, text

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.cli.main import cli
from ledger.config import Policy
from ledger.errors import BusyError
from ledger.store.dialects import LEDGER_LOCK_KEY
from tests.support.backends import rows
from tests.support.ledgers import TEST_CATALOG

SECRET = "pw-Zq81-never-shown"


@pytest.fixture
def pg(ledger_db: str | None) -> str:
    """A fresh PostgreSQL database for the test (skipped without a server outside CI)."""
    assert ledger_db is not None
    return ledger_db


pytestmark_pg = pytest.mark.parametrize("ledger_db", ["postgresql"], indirect=True)


def _open(home: Path, url: str, **policy: Any) -> Ledger:
    return Ledger.open(
        home,
        url,
        policy=Policy.model_validate(policy) if policy else None,
        catalog=Catalog.model_validate(TEST_CATALOG),
        env={},
    )


def _server_now_ms(url: str) -> int:
    return int(rows(url, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0])


@pytestmark_pg
def test_issue16_item1_write_takes_the_ledger_lock_before_reading_the_server_clock(
    home: Path, pg: str
) -> None:
    """A writer that waited for the lock stamps a time after it got it (R-DB-3b), and lock and
    clock cost one round trip together."""
    led = _open(home, pg)
    holder = create_engine(pg)
    locked, release = threading.Event(), threading.Event()
    released_at: list[int] = []

    def hold() -> None:
        with holder.connect() as conn, conn.begin():
            conn.execute(text(f"SELECT pg_advisory_xact_lock({LEDGER_LOCK_KEY})"))
            locked.set()
            release.wait(60)
            released_at.append(_server_now_ms(pg))  # before the commit lets the lock go

    seen: list[str] = []

    def capture(_c: Any, _cur: Any, sql: str, *_rest: Any) -> None:
        seen.append(" ".join(sql.split()))

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(30)
        threading.Timer(0.5, release.set).start()  # the reserve below waits about 0.5 s
        event.listen(led.db.engine, "before_cursor_execute", capture)
        res = led.reserve("s1", "alpha/small", input_bytes=10)
    finally:
        release.set()
        thread.join(30)
        event.remove(led.db.engine, "before_cursor_execute", capture)
        led.close()
        holder.dispose()
    assert res.created_ms >= released_at[0]  # the clock was read after the wait, not before
    assert seen[0] == (
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint "
        f"FROM (SELECT pg_advisory_xact_lock({LEDGER_LOCK_KEY})) AS locked"
    )
    assert not any("clock_timestamp" in sql for sql in seen[1:])  # one round trip, not two


@pytestmark_pg
def test_issue16_item1_skewed_host_clock_stamps_the_server_time(home: Path, pg: str) -> None:
    led = _open(home, pg)
    day = 86_400_000
    led.db.clock_fn = lambda: _server_now_ms(pg) + day  # this host runs a day fast
    before = _server_now_ms(pg)
    res = led.reserve("s1", "alpha/small", input_bytes=10)
    after = _server_now_ms(pg)
    led.close()
    assert before <= res.created_ms <= after
    stored = rows(pg, "SELECT newest_ms FROM clock")[0][0]
    assert stored == res.created_ms  # the ledger's time line is the server's


@pytestmark_pg
def test_issue16_item1_held_lock_is_busy_exit_4_and_writes_nothing(home: Path, pg: str) -> None:
    (home / "recovery.json").write_text('{"busyTimeoutMs": 300}')
    _open(home, pg).close()
    holder = create_engine(pg)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.connect() as conn, conn.begin():
            conn.execute(text(f"SELECT pg_advisory_xact_lock({LEDGER_LOCK_KEY})"))
            locked.set()
            release.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(30)
        led = Ledger.open(home, pg, catalog=Catalog.model_validate(TEST_CATALOG), env={})
        with pytest.raises(BusyError):
            led.reserve("s1", "alpha/small", input_bytes=10)
        led.close()
        result = CliRunner().invoke(
            cli, ["--home", str(home), "--db", pg, "reserve", "s2", "--model", "alpha/small"]
        )
        assert result.exit_code == 4, result.output
        assert result.output.strip() == (
            "ledger: database busy: the write lock was held past the busy timeout; "
            "nothing written, retry"
        )
    finally:
        release.set()
        thread.join(30)
        holder.dispose()
    assert rows(pg, "SELECT count(*) FROM reservations")[0][0] == 0
    assert rows(pg, "SELECT count(*) FROM sources")[0][0] == 0


def _cli(home: Path, url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--home", str(home), "--db", url, *args])


@pytest.mark.parametrize(
    ("url", "code"),
    [
        (f"postgresql+psycopg://bob:{SECRET}@127.0.0.1:1/ledger", 4),  # nothing listens
        (f"postgresql+psycopg://bob:{SECRET}@/ledger?host=/nonexistent-dir", 4),  # no socket
        (f"mysql://bob:{SECRET}@127.0.0.1/ledger", 2),  # not a supported backend
        (f"postgresql+psycopg2://bob:{SECRET}@127.0.0.1/ledger", 2),  # not our driver
        (f"postgresql+psycopg://bob:{SECRET}@127.0.0.1:notaport/ledger", 2),  # malformed
    ],
)
@pytest.mark.parametrize("command", [["status"], ["reserve", "s", "--model", "alpha/small"],
                                     ["db", "upgrade"], ["db", "current"]])
def test_issue16_item2_bad_or_unreachable_url_one_line_never_the_password(
    tmp_path: Path, url: str, code: int, command: list[str]
) -> None:
    home = tmp_path / "h"
    result = _cli(home, url, *command)
    assert result.exit_code == code, result.output
    assert result.output.count("\n") == 1
    assert result.output.startswith("ledger: ")
    assert SECRET not in result.output
    assert "Traceback" not in result.output


def test_issue16_item2_missing_driver_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ImportError
    result = _cli(tmp_path / "h", f"postgresql+psycopg://bob:{SECRET}@127.0.0.1/x", "status")
    assert result.exit_code == 2, result.output
    assert "python -m pip install -e '.[postgres]' (checkout)" in result.output
    assert SECRET not in result.output


@pytestmark_pg
def test_issue16_item2_missing_database_is_exit_4_without_the_password(
    home: Path, pg: str
) -> None:
    from sqlalchemy.engine import make_url

    url = make_url(pg).set(database="no_such_ledger_db", password=SECRET)
    result = _cli(home, url.render_as_string(hide_password=False), "status")
    assert result.exit_code == 4, result.output
    assert SECRET not in result.output
    assert result.output.count("\n") == 1


@pytestmark_pg
def test_issue16_item1_worker_clock_follows_the_server_on_a_skewed_host(
    home: Path, pg: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ledger.store.engine as engine
    from ledger.clock import now_ms

    day = 86_400_000
    monkeypatch.setattr(engine, "now_ms", lambda: now_ms() + day)  # this host runs a day fast
    led = _open(home, pg)
    res = led.reserve("s1", "alpha/small", input_bytes=10)
    # the clock the worker times calls with is on the server's line: the deadline is ahead of it
    assert res.created_ms - 5_000 <= led.db.clock_fn() <= res.deadline_ms
    led.close()


@pytestmark_pg
@pytest.mark.parametrize(
    "command",
    [["status"], ["source", "list"], ["cooldown", "list"],
     ["select", "s", "--model", "alpha/small"], ["db", "current"]],
)  # fmt: skip
def test_issue16_item2_read_on_an_empty_database_creates_nothing(
    home: Path, pg: str, command: list[str]
) -> None:
    # e.g. `--db …/postgres` by mistake: a read must not put the ledger's tables there
    result = _cli(home, pg, *command)
    tables = rows(pg, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    assert tables == []
    # issue 20 item 13: a read answers as an empty ledger (nothing recorded), creating nothing
    assert result.exit_code == 0, result.output
    if command == ["status"]:
        assert "no ledger database yet (nothing recorded)" in result.output
    if command == ["db", "current"]:
        assert "(empty)" in result.output
    assert "Traceback" not in result.output
