"""ledger: a SQLite-backed budget and recovery ledger for background jobs that call LLM providers."""

from __future__ import annotations

__version__ = "0.1.0"
