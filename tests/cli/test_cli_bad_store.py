"""Issue 15 items 5 and 6: a bad `--db` / `--home` is one line and exit 2 or 4, never a hang or
"internal error"; reads create nothing; a closed stdout (`| head`) ends quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ledger.cli.main import cli

SECRET = "s3cretPW"
READS = (
    ("status",),
    ("status", "--json"),
    ("select", "s1"),
    ("source", "list"),
    ("source", "show", "s1"),
    ("cooldown", "list"),
    ("db", "current"),
    ("config", "validate"),
    ("catalog", "show"),
)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def one_line(result: Result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "internal error" not in lines[0]
    return lines[0]


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        (f"nosuchdialect://user:{SECRET}@host/db", "not a supported SQLite path"),
        (f"mysql://user:{SECRET}@host/db", "not a supported SQLite path"),
        (f"postgresql+asyncpg://user:{SECRET}@host/db", "not a supported SQLite path"),
    ],
)
@pytest.mark.parametrize("args", [("status",), ("source", "add", "s1"), ("db", "upgrade")])
def test_issue15_item5_bad_db_url_exit_2_never_echoed(
    tmp_path: Path, url: str, rule: str, args: tuple[str, ...]
) -> None:
    result = invoke("--home", str(tmp_path / "h"), "--db", url, *args)
    assert result.exit_code == 2
    line = one_line(result)
    assert rule in line
    assert SECRET not in line
    assert "host" not in line
    assert tree(tmp_path) == []


def test_issue15_item5_db_in_missing_directory(tmp_path: Path) -> None:
    db = str(tmp_path / "nodir" / "ledger.db")
    write = invoke("--home", str(tmp_path / "h"), "--db", db, "source", "add", "s1")
    assert write.exit_code == 2
    assert "directory does not exist" in one_line(write)
    # a missing file in an existing directory is an empty ledger (issue 20 item 13), said so
    read = invoke("--home", str(tmp_path / "h"), "--db", str(tmp_path / "ledger.db"), "status")
    assert read.exit_code == 0, read.output
    assert "WARNING: no ledger database at" in read.output
    assert tree(tmp_path) == []


MISSING_DIR_LINE = "ledger: the database's directory does not exist; create it first"


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("status", "--prometheus"),
        ("select", "s1"),
        ("source", "list"),
        ("source", "show", "s1"),
        ("cooldown", "list"),
        ("db", "current"),
    ],
)
def test_r_home_2_read_of_db_in_missing_directory_is_exit_2(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Issue 29 item 12: a mistyped `--db` (its directory does not exist) is not a healthy empty
    ledger for a read either: exit 2, one line on stderr, nothing created."""
    db = str(tmp_path / "nodir" / "l.db")
    result = invoke("--home", str(tmp_path / "h"), "--db", db, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [MISSING_DIR_LINE]
    assert tree(tmp_path) == []
    env = invoke("--home", str(tmp_path / "h"), *args, env={"LEDGER_DB": db})
    assert env.exit_code == 2, env.output
    assert env.stderr.splitlines() == [MISSING_DIR_LINE]


def test_r_home_2_status_json_of_db_in_missing_directory(tmp_path: Path) -> None:
    db = str(tmp_path / "nodir" / "l.db")
    result = invoke("--home", str(tmp_path / "h"), "--db", db, "status", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {
        "error": {
            "code": "UsageError",
            "message": "the database's directory does not exist; create it first",
        }
    }


def test_r_home_2_fresh_state_directory_still_reads_empty(tmp_path: Path) -> None:
    """The state directory itself may be missing (a fresh `--home`, also named by `--db`)."""
    home = tmp_path / "deep" / "state"
    for extra in ((), ("--db", str(home / "ledger.db"))):
        result = invoke("--home", str(home), *extra, "status", "--json")
        assert result.exit_code == 0, result.output
        assert any("nothing recorded" in w for w in json.loads(result.stdout)["warnings"])
    assert tree(tmp_path) == []


def test_r_diag_2_prometheus_says_down_when_the_ledger_cannot_be_read(tmp_path: Path) -> None:
    """`ledger_up 0` on stdout (a cron textfile exporter's alert fires), the error on stderr."""
    from prometheus_client.parser import text_string_to_metric_families

    db = str(tmp_path / "nodir" / "l.db")
    proc = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(tmp_path / "h"), "--db", db, "status",
         "--prometheus"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [MISSING_DIR_LINE]
    families = {f.name: f for f in text_string_to_metric_families(proc.stdout)}
    assert list(families) == ["ledger_up"]
    assert families["ledger_up"].samples[0].value == 0


def test_issue15_item5_dangling_symlink_db(tmp_path: Path) -> None:
    link = tmp_path / "ledger.db"
    link.symlink_to(tmp_path / "gone.db")
    for args in (("source", "add", "s1"), ("status",)):
        result = invoke("--home", str(tmp_path / "h"), "--db", str(link), *args)
        assert result.exit_code == 2, args
        assert "dangling" in one_line(result)
    assert tree(tmp_path) == ["ledger.db"]
    assert not (tmp_path / "gone.db").exists()


def test_issue15_item5_fifo_db_never_hangs(tmp_path: Path) -> None:
    fifo = tmp_path / "ledger.db"
    os.mkfifo(fifo)
    for args in (("status",), ("source", "add", "s1"), ("db", "current"), ("db", "upgrade")):
        proc = subprocess.run(
            [sys.executable, "-m", "ledger", "--home", str(tmp_path / "h"), "--db", str(fifo),
             *args],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert proc.returncode == 4, (args, proc.stderr)
        assert proc.stdout == ""
        assert proc.stderr.splitlines() == [
            "ledger: the database path is not a regular file (a FIFO, a device or a directory); "
            "not opened"
        ]


def test_issue15_item5_home_of_unknown_user_exit_2(tmp_path: Path) -> None:
    for args in (
        ("--home", "~nosuchuser-ledger-test", "--db", str(tmp_path / "x.db")),
        ("--home", str(tmp_path / "h"), "--db", "~nosuchuser-ledger-test/x.db"),
    ):
        result = invoke(*args, "status")
        assert result.exit_code == 2, result.output
        assert "`~` names a user without a home directory" in one_line(result)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("args", READS)
def test_issue15_item5_reads_create_nothing(tmp_path: Path, args: tuple[str, ...]) -> None:
    home = tmp_path / "deep" / "state"
    result = invoke("--home", str(home), *args)
    assert result.exit_code in (0, 2, 3, 4), result.output  # 3: select finds no route
    if result.exit_code in (2, 4) and "--json" not in args:
        one_line(result)
    assert tree(tmp_path) == []
    elsewhere = invoke("--home", str(home), "--db", str(tmp_path / "a" / "b.db"), *args)
    assert elsewhere.exit_code in (0, 2, 3, 4), elsewhere.output
    assert tree(tmp_path) == []


def test_issue15_item5_status_names_the_missing_database(tmp_path: Path) -> None:
    result = invoke("--home", str(tmp_path / "h"), "status", "--json")
    assert result.exit_code == 0  # an empty ledger (issue 20 item 13), said so
    assert any(
        str(tmp_path / "h" / "ledger.db") in w and "nothing recorded" in w
        for w in json.loads(result.stdout)["warnings"]
    )


@pytest.mark.parametrize("args", [("catalog", "show"), ("config", "schema"), ("--help",)])
def test_issue15_item6_closed_stdout_ends_quietly(tmp_path: Path, args: tuple[str, ...]) -> None:
    """`ledger catalog show | head`: the reader goes away before ledger writes (a real pipe)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledger", "--home", str(tmp_path), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()  # long before the interpreter has started and written anything
    err = proc.stderr.read()
    proc.stderr.close()
    code = proc.wait(timeout=60)
    assert err == b""
    assert code in (1, 141)  # 128 + SIGPIPE like `cat`; click's own help path exits 1


@pytest.fixture(scope="module")
def many_sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger with 4000 sources (more than a pipe buffer, 64 KiB, even as text), added in one
    write transaction through the store's own insert."""
    from ledger.api import Ledger
    from ledger.store import reservations

    home = tmp_path_factory.mktemp("many") / "h"
    ledger = Ledger.open(home)
    with ledger.db.write() as txn:
        for n in range(4000):
            reservations.insert_source(txn.conn, f"source-{n:05d}", txn.now, in_queue=True)
    ledger.close()
    return home


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_issue33_a_reader_that_leaves_mid_listing_gives_141_text_and_json(
    many_sources: Path, json_flag: tuple[str, ...]
) -> None:
    """`ledger source list --json | head -c 10` exited 0 where the text listing exits 141: both
    notice the reader leaving while they write, and stop quietly with 128 + SIGPIPE."""
    home = many_sources
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledger", "--home", str(home), "source", "list", *json_flag],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert len(proc.stdout.read(10)) == 10  # `head -c 10`: read a little, then go away
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141
    assert err == b""
