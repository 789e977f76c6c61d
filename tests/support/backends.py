"""The contract suite's backends (R-DB-7): every backend-parametrized test runs on each of them.

SQLite is the ledger.db file in the test's state directory. PostgreSQL is a fresh database per test
on the server named by $LEDGER_TEST_PG_URL (scripts/pg-test-server.sh starts a throw-away one;
.ci/run always does). Without that variable the PostgreSQL cases are skipped on a developer's
machine, but fail under CI: a contract suite that silently ran on one backend would prove nothing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ledger.store.dialects import make_engine

PG_URL_ENV = "LEDGER_TEST_PG_URL"
BACKENDS = ("sqlite", "postgresql")


def pg_server_url() -> str:
    """The test server's URL, or skip (developer machine) / fail (CI) when there is none."""
    url = os.environ.get(PG_URL_ENV, "")
    if url:
        return url
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the PostgreSQL contract suite: set {PG_URL_ENV}")
    pytest.skip(f"PostgreSQL contract cases need {PG_URL_ENV} (scripts/pg-test-server.sh)")


@contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new, empty database on the test server for one test; dropped afterwards."""
    server = make_url(pg_server_url())
    name = f"ledger_t_{uuid.uuid4().hex[:16]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield server.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def db_url(home: Path, ledger_db: str | None) -> str:
    """The SQLAlchemy URL a test reads the ledger through (the SQLite file by default)."""
    return ledger_db or f"sqlite:///{home / 'ledger.db'}"


def rows(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Read rows straight from the database, outside the ledger (tests check what was stored)."""
    engine = make_engine(url, busy_timeout_ms=10_000)  # SQLite: the ledger's own library (R-DB-3c)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql), params)]
    finally:
        engine.dispose()


def write(url: str, sql: str, **params: Any) -> int:
    """Change rows straight in the database, outside the ledger: it stands for what time or
    another process did (a deadline that has come). Returns the number of rows changed."""
    engine = make_engine(url, busy_timeout_ms=10_000)
    try:
        with engine.begin() as conn:
            return int(conn.execute(text(sql), params).rowcount)
    finally:
        engine.dispose()
