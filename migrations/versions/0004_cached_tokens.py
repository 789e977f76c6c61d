"""cached tokens: prompt-cache writes and reads stored apart from input tokens (issue 20 item 4)

Adds two nullable columns to `reservations`: `cache_write_tokens` and `cache_read_tokens`, the
prompt tokens a call wrote to or read from the provider's cache (`input_tokens` stays the
uncached prompt tokens). Rows settled before the upgrade keep NULL: their cache usage was never
read. `daily_totals` (compacted history) gains the same two sums, 0 for the days already folded.
Costs already stored are left as they were. Downgrade drops the columns; the rows stay.

Revision ID: 0004
Revises: 0003b
Create Date: 2026-12-01 09:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(sa.Column("cache_write_tokens", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("cache_read_tokens", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("daily_totals") as batch:
        for name in ("cache_write_tokens", "cache_read_tokens"):
            batch.add_column(
                sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False)
            )


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("daily_totals") as batch:
        batch.drop_column("cache_read_tokens")
        batch.drop_column("cache_write_tokens")
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("cache_read_tokens")
        batch.drop_column("cache_write_tokens")
