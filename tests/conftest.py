"""Shared fixtures: real SQLite files built by the migrations in tmp_path, a controllable clock."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from tests.backends import fresh_pg_database

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

T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a fixed ledger time for tests

TEST_CATALOG: dict[str, Any] = {
    "providers": {
        "alpha": {"available": True, "api": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1"},
        "beta": {"available": True, "api": "anthropic-messages", "baseUrl": "http://127.0.0.1:9"},
        "gamma": {"credentialEnv": "GAMMA_TEST_KEY"},
    },
    "models": [
        {
            "provider": "alpha",
            "id": "small",
            "contextWindow": 100000,
            "maxOutputTokens": 4096,
            "pricing": [{"inputUsdPerMTok": 1, "outputUsdPerMTok": 2}],
        },
        {
            "provider": "alpha",
            "id": "big",
            "contextWindow": 200000,
            "maxOutputTokens": 8192,
            "reasoning": True,
            "pricing": [
                {"upToInputTokens": 100000, "inputUsdPerMTok": 3, "outputUsdPerMTok": 15},
                {"inputUsdPerMTok": 6, "outputUsdPerMTok": 22.5},
            ],
        },
        {
            "provider": "beta",
            "id": "mid",
            "contextWindow": 150000,
            "maxOutputTokens": 4096,
            "pricing": [{"inputUsdPerMTok": 0.5, "outputUsdPerMTok": 1.5}],
        },
        {"provider": "beta", "id": "free/unknown", "contextWindow": 8000},
        {
            "provider": "gamma",
            "id": "g1",
            "contextWindow": 32000,
            "pricing": [{"inputUsdPerMTok": 0.1, "outputUsdPerMTok": 0.2}],
        },
    ],
}


class Clock:
    """A manual clock in UTC ms for store tests."""

    def __init__(self, start: int = T0) -> None:
        self.ms = start

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        self.ms += ms


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


AFFECTED_SQLITE = "3.40.1"  # inside the WAL-reset bug's range (R-DB-3a): the rollback journal


@pytest.fixture
def rollback_journal(monkeypatch: pytest.MonkeyPatch) -> str:
    """This process's ledger judges its SQLite affected, so it runs the rollback journal
    (`truncate`) whatever library is linked: the rollback path's tests run on every machine.
    A child process gets the same with `LEDGER_SQLITE=stdlib` where the stdlib is affected."""
    from ledger.store import sqlite_driver

    monkeypatch.setattr(sqlite_driver, "library_version", lambda: AFFECTED_SQLITE)
    return AFFECTED_SQLITE


def write_policy(home: Path, **keys: Any) -> None:
    """Write recovery.json with the given camelCase keys."""
    (home / "recovery.json").write_text(json.dumps(keys))


LedgerFactory = Callable[..., Ledger]


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
