"""Alembic migrations for the ledger schema (shipped inside the wheel)."""
