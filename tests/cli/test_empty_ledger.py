"""Issue 20 item 13, issue 25 items 2 and 3: a state directory without a database is an empty
ledger. Read-only commands answer as one (nothing recorded) and create nothing; a bad
`recovery.json` is reported first; a write that fails (exit 2) or is refused (exit 3) on it
creates nothing; the first write that records something creates the directory and database."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ledger.api import Ledger
from ledger.cli.main import cli
from ledger.errors import NotFoundError
from ledger.home import NoLedgerError
from ledger.records import Cancelled
from ledger.store import sqlite_driver
from ledger.store.views import source_rows
from tests.support.ledgers import TEST_CATALOG

READS_EXIT_0 = (
    ("status",),
    ("status", "--json"),
    ("status", "--prometheus"),
    ("source", "list"),
    ("source", "list", "--json"),
    ("cooldown", "list"),
    ("cooldown", "list", "--json"),
    ("db", "current"),
    ("config", "validate"),
    ("catalog", "show"),
)


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args], env={"GAMMA_TEST_KEY": ""})


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def home_with_catalog(tmp_path: Path) -> Path:
    home = tmp_path / "h"
    home.mkdir()
    (home / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    return home


@pytest.mark.parametrize("args", READS_EXIT_0)
def test_issue20_item13_reads_after_catalog_init_answer_as_empty(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    home = tmp_path / "h"
    assert invoke(home, "catalog", "init").exit_code == 0
    result = invoke(home, *args)
    assert result.exit_code == 0, result.output
    assert "internal error" not in result.output
    assert tree(tmp_path) == ["h", "h/catalog.json"]


@pytest.mark.parametrize("args", READS_EXIT_0)
def test_issue25_item2_reads_on_no_directory_exit_0_create_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    result = invoke(tmp_path / "deep" / "h", *args)
    assert result.exit_code == 0, result.output
    assert tree(tmp_path) == []


def test_issue20_item13_select_and_source_show_answer_as_empty(tmp_path: Path) -> None:
    home = home_with_catalog(tmp_path)
    select = invoke(home, "select", "s1", "--json")
    assert select.exit_code == 0, select.output
    assert json.loads(select.stdout)["routes"]
    show = invoke(home, "source", "show", "s1")
    assert show.exit_code == 2
    assert show.output == "ledger: unknown source\n"
    assert tree(home) == ["catalog.json"]


def test_issue20_item13_status_says_nothing_is_recorded_yet(tmp_path: Path) -> None:
    home = home_with_catalog(tmp_path)
    doc = json.loads(invoke(home, "status", "--json").stdout)
    assert doc["sources"]["counts"] == {
        "queued": 0, "leased": 0, "done": 0, "paused": 0, "gateway_one_off": 0
    }
    assert doc["hourly"]["used"] == 0
    assert doc["store"]["revision"] is None
    assert any(
        f"no ledger database at {home / 'ledger.db'} yet" in w for w in doc["warnings"]
    ), doc["warnings"]
    assert tree(home) == ["catalog.json"]


@pytest.mark.parametrize(
    "args",
    [("status",), ("select", "s1"), ("cooldown", "list"), ("source", "list"), ("db", "current"),
     ("source", "add", "s1"), ("reserve", "s1", "--model", "alpha/small")],
)
def test_issue20_item13_bad_policy_is_reported_first(tmp_path: Path, args: tuple[str, ...]) -> None:
    home = home_with_catalog(tmp_path)
    (home / "recovery.json").write_text('{"callsPerHour": "many"}')
    result = invoke(home, *args)
    assert result.exit_code == 2, result.output
    assert "recovery.json: callsPerHour: must be an integer" in result.output
    assert tree(home) == ["catalog.json", "recovery.json"]


@pytest.mark.parametrize(
    "args",
    [
        ("reserve", "a", "--model", "nosuch/x"),
        ("settle", "5", "--ok"),
        ("cooldown", "clear", "openai"),
        ("cooldown", "set", "openai", "1h"),
        ("source", "pause", "s1"),
    ],
)
def test_issue25_item3_failed_write_on_fresh_home_creates_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    result = invoke(tmp_path / "h", *args)
    assert result.exit_code == 2, result.output
    assert tree(tmp_path) == []


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("settle", "5", "--ok"), 2),
        (("reserve", "a", "--model", "alpha/small", "--after", "5"), 2),
        (("source", "resume", "s1"), 2),
        (("reserve", "a", "--model", "gamma/g1"), 3),  # denied by the route rule below
        (("cooldown", "clear", "alpha"), 0),  # removed 0: nothing to record
        (("worker", "run", "--once"), 0),  # an empty queue
        (("db", "compact"), 0),  # nothing to fold
    ],
)
def test_issue25_item3_failed_or_empty_write_with_catalog_creates_nothing(
    tmp_path: Path, args: tuple[str, ...], code: int
) -> None:
    home = home_with_catalog(tmp_path)
    (home / "recovery.json").write_text(json.dumps({"routes": {"deny": ["gamma/*"]}}))
    result = invoke(home, *args)
    assert result.exit_code == code, result.output
    assert tree(home) == ["catalog.json", "recovery.json"]


def test_issue25_item3_first_write_that_records_creates_the_ledger(tmp_path: Path) -> None:
    home = tmp_path / "deep" / "h"
    assert invoke(home, "source", "add", "s1").exit_code == 0
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "ledger.db").stat().st_mode) == 0o600
    assert "s1" in invoke(home, "source", "list").output


def test_issue20_item13_lazy_open_creates_nothing_until_a_write(tmp_path: Path) -> None:
    home = tmp_path / "h"
    reader = Ledger.open(home, env={}, lazy=True)
    assert tree(tmp_path) == []
    assert source_rows(reader.db) == []
    read_only = Ledger.open(home, env={}, create=False)
    with pytest.raises(NoLedgerError):  # a read-only handle never creates the ledger
        read_only.add_source("s2")
    read_only.close()
    assert tree(tmp_path) == []
    writer = Ledger.open(home, env={}, lazy=True)
    assert writer.add_source("s1") is True
    assert (home / "ledger.db").exists()
    # the first ledger, opened before the database existed, now reads the one another created
    assert [r["id"] for r in source_rows(reader.db)] == ["s1"]
    reader.close()
    writer.close()


def _dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    with sqlite_driver.connect(path) as raw:
        names = [r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: sorted(raw.execute(f'SELECT * FROM "{n}"').fetchall(), key=repr) for n in names}


@pytest.mark.parametrize(
    ("args", "changed"),
    [
        (("reserve", "s1", "--model", "gamma/g1"), {"clock"}),  # denied_by_route
        (("reserve", "s1", "--model", "alpha/small"), {"clock", "sources"}),  # provider_cooldown
    ],
)
def test_issue25_item3_a_refusal_writes_only_what_the_readme_says(
    tmp_path: Path, args: tuple[str, ...], changed: set[str]
) -> None:
    home = home_with_catalog(tmp_path)
    (home / "recovery.json").write_text(json.dumps({"routes": {"deny": ["gamma/*"]}}))
    assert invoke(home, "source", "add", "s1").exit_code == 0
    assert invoke(home, "cooldown", "set", "alpha", "1h").exit_code == 0
    before = _dump(home / "ledger.db")
    time.sleep(0.01)  # the refusal's ledger time is later than the last write's
    refused = invoke(home, *args)
    assert refused.exit_code == 3, refused.output
    after = _dump(home / "ledger.db")
    assert {name for name in after if after[name] != before[name]} == changed
    if "sources" in changed:  # only the source's last-checked time moved
        [old] = before["sources"]
        [new] = after["sources"]
        assert [k for k, (a, b) in enumerate(zip(old, new, strict=True)) if a != b] == [
            _column_index(home, "sources", "last_checked_ms")
        ]


def _column_index(home: Path, table: str, column: str) -> int:
    with sqlite_driver.connect(home / "ledger.db") as raw:
        names = [r[1] for r in raw.execute(f'PRAGMA table_info("{table}")')]
    return names.index(column)


def test_issue25_item3_first_writers_at_once_create_one_ledger(tmp_path: Path) -> None:
    """Eight processes record their first write on a state directory that does not exist yet."""
    home = tmp_path / "h"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ledger", "--home", str(home), "source", "add", f"s{i}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for i in range(8)
    ]
    errors = [(p.wait(timeout=120), p.communicate(timeout=60)[1]) for p in procs]
    assert [code for code, _ in errors] == [0] * 8, errors
    listed = json.loads(invoke(home, "source", "list", "--json").stdout)["sources"]
    assert sorted(s["id"] for s in listed) == [f"s{i}" for i in range(8)]


def test_r_srv_3_steps_on_a_ledger_with_no_database_yet(tmp_path: Path) -> None:
    """Group-committed steps on a lazily opened ledger behave like the calls they stand for:
    a step that records nothing (an unknown reservation) creates nothing; a reserve creates
    the database and is granted."""
    home = home_with_catalog(tmp_path)
    led = Ledger.open(home, env={}, lazy=True)
    answers = led.write_steps([led.settle_step(7, Cancelled())])
    assert isinstance(answers[0].error, NotFoundError)
    assert tree(tmp_path) == ["h", "h/catalog.json"]
    [granted] = led.write_steps([led.reserve_step("s1", "alpha/small")])
    assert granted.get().source == "s1"
    assert (home / "ledger.db").exists()
    led.close()
