"""Alembic environment: runs on a connection ledger hands in (whole upgrade, one transaction)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from ledger.store.schema import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Use the connection ledger passes in, or open one from the configured URL (developers)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url or pass a connection")
    engine = create_engine(url)
    with engine.begin() as conn:
        _run(conn)


if context.is_offline_mode():
    raise RuntimeError("offline migrations are not supported")
run_migrations_online()
