"""The documented public paths keep working whatever moves inside the package (the structure
issue: only import lines and helper paths may change, never what users import)."""

from __future__ import annotations

import importlib

import pytest

import ledger
from ledger.worker.runner import load_handler

PUBLIC = [
    ("ledger", "Ledger"),
    ("ledger", "Refused"),
    ("ledger", "Success"),
    ("ledger", "Failed"),
    ("ledger", "Cancelled"),
    ("ledger", "classify_http"),
    ("ledger", "Reservation"),
    ("ledger", "LedgerError"),
    ("ledger", "FailureKind"),
    ("ledger", "RefusalReason"),
    ("ledger.client", "LedgerClient"),
    ("ledger.catalog", "example_catalog"),
    ("ledger.worker.runner", "echo_handler"),
]


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_documented_import_path(module: str, name: str) -> None:
    assert callable(getattr(importlib.import_module(module), name))


def test_root_package_exports_every_name_it_lists() -> None:
    for name in ledger.__all__:
        assert getattr(ledger, name) is not None


def test_echo_handler_resolves_as_a_handler_spec() -> None:
    """`ledger worker run --handler ledger.worker:echo_handler`, the README's example."""
    from ledger.worker.runner import echo_handler

    assert load_handler("ledger.worker:echo_handler") is echo_handler


def test_example_catalog_has_models() -> None:
    from ledger.catalog import example_catalog

    assert example_catalog().models
