"""Shared fixtures: real SQLite files built by the migrations in tmp_path, a controllable clock."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from ledger.store import sqlite_driver
from tests.support.backends import fresh_pg_database
from tests.support.ledgers import AFFECTED_SQLITE, TEST_CATALOG, Clock, LedgerFactory

# pytest-xdist's workers start with COLUMNS=80; `ledger status` sizes its text by COLUMNS when
# it is set, so a test would read a different layout in a worker than in one process. Tests
# that mean a width pass it (CliRunner env={"COLUMNS": ...}).
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

# CI machines are shared and noisy: hypothesis must judge behaviour, never speed. No per-example
# deadline and no "too slow" health check; example counts are set per test.
settings.register_profile(
    "ledger", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
# In CI (CI=true) the search is derandomized: a submission's verdict must not depend on luck; the
# random search still runs on every developer's machine.
settings.register_profile("ledger-ci", parent=settings.get_profile("ledger"), derandomize=True)
settings.load_profile("ledger-ci" if os.environ.get("CI") else "ledger")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def home(tmp_path: Path, ledger_db: str | None) -> Path:
    """A state directory with the test catalog (its database: the `ledger_db` backend)."""
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    (path / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    return path


@pytest.fixture
def rollback_journal(monkeypatch: pytest.MonkeyPatch) -> str:
    """This process's ledger judges its SQLite affected, so it runs the rollback journal
    (`truncate`) whatever library is linked: the rollback path's tests run on every machine.
    A child process gets the same with `LEDGER_SQLITE=stdlib` where the stdlib is affected."""
    monkeypatch.setattr(sqlite_driver, "library_version", lambda: AFFECTED_SQLITE)
    return AFFECTED_SQLITE


@pytest.fixture
def ledger_db(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str | None]:
    """The backend under test: None for SQLite (the default), else a fresh PostgreSQL database's
    URL, exported as $LEDGER_DB so the library and the CLI in this process both use it.
    Parametrize with `pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)`."""
    if getattr(request, "param", "sqlite") == "sqlite":
        monkeypatch.delenv("LEDGER_DB", raising=False)
        yield None
        return
    with fresh_pg_database() as url:
        monkeypatch.setenv("LEDGER_DB", url)
        yield url


@pytest.fixture
def make_ledger(home: Path, clock: Clock) -> Iterator[LedgerFactory]:
    opened: list[Ledger] = []

    def factory(**policy_keys: Any) -> Ledger:
        policy = Policy.model_validate(policy_keys) if policy_keys else None
        ledger = Ledger.open(
            home,
            policy=policy,
            catalog=Catalog.model_validate(TEST_CATALOG),
            env={},
            clock=clock,
            jitter=lambda: 0.0,
        )
        opened.append(ledger)
        return ledger

    yield factory
    for ledger in opened:
        ledger.close()
