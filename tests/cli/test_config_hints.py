"""Issue 15 items 4 and 8: a missing catalog is named with the command that makes one, wherever a
catalog is needed; inert policy entries carry a reason code in `config validate`, at worker start
and in `status`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ledger.catalog import NO_CATALOG, Catalog
from ledger.cli.main import cli
from ledger.config import Policy
from ledger.inert import InertReason, inert_entries
from ledger.store import sqlite_driver
from tests.support.ledgers import TEST_CATALOG, write_policy

HINT = "`ledger catalog init`"


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    """A state directory with a ledger but no catalog.json."""
    home = tmp_path / "bare"
    assert invoke(home, "db", "upgrade").exit_code == 0
    return home


def test_issue15_item4_validate_warns_without_a_catalog(bare: Path) -> None:
    text = invoke(bare, "config", "validate")
    assert text.exit_code == 0
    assert f"warning: {NO_CATALOG}" in text.output.splitlines()
    doc = json.loads(invoke(bare, "config", "validate", "--json").output)
    assert doc["models"] == 0
    assert doc["warnings"] == [NO_CATALOG]


def test_issue15_item4_status_select_reserve_worker_name_the_fix(bare: Path) -> None:
    status = invoke(bare, "status")
    assert status.exit_code == 0
    assert f"WARNING: {NO_CATALOG}" in " ".join(status.output.split())
    assert NO_CATALOG in json.loads(invoke(bare, "status", "--json").output)["warnings"]
    select = invoke(bare, "select", "s1")
    assert select.exit_code == 3
    assert f"hint: {NO_CATALOG}" in select.output
    for args in (("reserve", "s1", "--model", "a/b"), ("select", "s1", "--model", "a/b")):
        result = invoke(bare, *args)
        assert result.exit_code == 2, args
        assert HINT in result.output


def _dump(home: Path) -> list[str]:
    """Every schema entry and row of the file (pysqlite3's connections have no iterdump)."""
    conn = sqlite_driver.connect(home / "ledger.db")
    try:
        schema = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
        lines = [repr(row) for row in schema]
        for _, name, _ in (row for row in schema if row[0] == "table"):
            lines += [f"{name}: {row!r}" for row in conn.execute(f'SELECT * FROM "{name}"')]
        return lines
    finally:
        conn.close()


def test_r_q_3_worker_run_without_a_catalog_is_bad_configuration(
    bare: Path, tmp_path: Path
) -> None:
    """No catalog (no models) is exit 2 with the NO_CATALOG line, not 3 (a budget refusal)."""
    assert invoke(bare, "source", "add", "s1").exit_code == 0
    before = _dump(bare)
    for extra in ((), ("--json",)):
        worker = CliRunner().invoke(cli, ["--home", str(bare), "worker", "run", "--once", *extra])
        assert worker.exit_code == 2, worker.output
        if extra:
            assert json.loads(worker.stdout)["error"]["message"] == NO_CATALOG
        else:
            assert worker.stderr.splitlines() == [f"ledger: {NO_CATALOG}"]
            assert worker.stdout == ""
    assert _dump(bare) == before  # nothing written: the source was not even claimed
    fresh = tmp_path / "fresh"
    worker = CliRunner().invoke(cli, ["--home", str(fresh), "worker", "run"])
    assert worker.exit_code == 2
    assert worker.stderr.splitlines() == [f"ledger: {NO_CATALOG}"]
    assert not fresh.exists()


def test_issue15_item4_a_catalog_without_the_model_keeps_the_plain_message(home: Path) -> None:
    result = invoke(home, "reserve", "s1", "--model", "alpha/nope")
    assert result.exit_code == 2
    assert HINT not in result.output
    assert "not in the catalog" in result.output


CATALOG = Catalog.model_validate(
    {
        **TEST_CATALOG,
        "models": [
            *TEST_CATALOG["models"], {"provider": "alpha", "id": "img", "output": ["image"]}
        ],
    }
)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"defaultModel": "nobody/x"}, [("defaultModel", InertReason.UNKNOWN_PROVIDER)]),
        ({"defaultModel": "alpha/smal"}, [("defaultModel", InertReason.NOT_IN_CATALOG)]),
        ({"defaultModel": "gamma/g1"}, [("defaultModel", InertReason.PROVIDER_UNAVAILABLE)]),
        ({"defaultModel": "alpha/img"}, [("defaultModel", InertReason.NO_TEXT)]),
        ({"defaultModel": "alpha/small"}, []),
        (
            {"fallbackModels": ["beta/mid", "zeta/q", "beta/nope", "gamma/g1"]},
            [
                ("fallbackModels[1]", InertReason.UNKNOWN_PROVIDER),
                ("fallbackModels[2]", InertReason.NOT_IN_CATALOG),
                ("fallbackModels[3]", InertReason.PROVIDER_UNAVAILABLE),
            ],
        ),
        (
            {"routes": {"allow": ["alpha/*", "gamma/*", "alpha/img"], "deny": ["x?/*"]}},
            [
                ("routes.allow[1]", InertReason.PROVIDER_UNAVAILABLE),
                ("routes.allow[2]", InertReason.NO_TEXT),
                ("routes.deny[0]", InertReason.MATCHES_NOTHING),
            ],
        ),
    ],
)
def test_issue15_item8_every_inert_entry_has_its_reason(
    keys: dict[str, Any], expected: list[tuple[str, InertReason]]
) -> None:
    found = inert_entries(Policy.model_validate(keys), CATALOG, env={})
    assert [(e.field, e.reason) for e in found] == expected


def test_issue15_item8_reasons_at_worker_start_and_in_status(home: Path) -> None:
    write_policy(home, defaultModel="alpha/smal", fallbackModels=["gamma/g1"])
    expected = [
        "defaultModel: not_in_catalog (no catalog model has this id); inert",
        "fallbackModels[0]: provider_unavailable (its provider is not available (credential "
        "variable unset)); inert",
    ]
    validate = json.loads(invoke(home, "config", "validate", "--json").output)
    assert validate["warnings"] == expected
    assert invoke(home, "source", "add", "s1").exit_code == 0
    worker = CliRunner().invoke(
        cli, ["--home", str(home), "worker", "run", "--once"], env={"GAMMA_TEST_KEY": ""}
    )
    assert [line for line in worker.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: {w}" for w in expected
    ]
    doc = json.loads(invoke(home, "status", "--json").output)
    assert [(e["field"], e["reason"]) for e in doc["inert"]] == [
        ("defaultModel", "not_in_catalog"),
        ("fallbackModels[0]", "provider_unavailable"),
    ]
    assert doc["warnings"][-2:] == expected
    text = " ".join(invoke(home, "status").output.split())
    assert "WARNING: defaultModel: not_in_catalog" in text
