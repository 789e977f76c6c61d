"""Scratch ledgers for property tests: a database built once by the migrations, copied for each
example (building one per example would cost a migration run each)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from ledger.api import Ledger
from ledger.catalog import Catalog
from ledger.config import Policy
from tests.support.ledgers import TEST_CATALOG, Clock

CATALOG = Catalog.model_validate(TEST_CATALOG)


@cache
def template_db() -> bytes:
    """A database built once by the migrations; each example starts from a copy."""
    with tempfile.TemporaryDirectory() as tmp:
        Ledger.open(tmp, catalog=CATALOG, env={}).close()
        return (Path(tmp) / "ledger.db").read_bytes()


@contextmanager
def scratch_ledger(clock: Clock, policy: Policy) -> Iterator[Ledger]:
    """A fresh ledger under `policy` on a copy of the template database, removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix="ledger-scratch-"))
    (home / "ledger.db").write_bytes(template_db())
    (home / "ledger.db").chmod(0o600)
    led = Ledger.open(
        home, policy=policy, catalog=CATALOG, env={}, clock=clock, jitter=lambda: 0.0
    )
    try:
        yield led
    finally:
        led.close()
        shutil.rmtree(home, ignore_errors=True)
