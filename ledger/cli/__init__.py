"""The click CLI: each command parses, calls one library function, renders."""

from __future__ import annotations

from ledger.cli.main import main

__all__ = ["main"]
