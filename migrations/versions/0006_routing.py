"""routing: pool cursors, sticky leases, and each reservation's pool and effort (issue 30)

Adds `pool_cursors` (the index of the candidate a round-robin pool granted last, R-RT-5) and
`pool_sticky` (per pool and scope the candidate that last succeeded, R-RT-6), both empty at the
upgrade, and three nullable columns on `reservations`: `pool` (the pool the concrete model was
chosen from), `effort` (the route's reasoning effort) and `sticky_scope` (the lease scope settle
keeps). Existing reservations keep NULL there: they were reserved on a model key. Downgrade drops
the tables and the columns (pool choices and leases are forgotten; reservations keep their model).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 19:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "pool_cursors",
        sa.Column("pool", sa.String(length=100), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pool", name=op.f("pk_pool_cursors")),
    )
    op.create_table(
        "pool_sticky",
        sa.Column("pool", sa.String(length=100), nullable=False),
        sa.Column("scope", sa.String(length=200), nullable=False),
        sa.Column("model_key", sa.String(length=300), nullable=False),
        sa.Column("chosen_ms", sa.BigInteger(), nullable=False),
        sa.Column("success_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("pool", "scope", name=op.f("pk_pool_sticky")),
    )
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(sa.Column("pool", sa.String(length=100), nullable=True))
        batch.add_column(sa.Column("effort", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("sticky_scope", sa.String(length=200), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("sticky_scope")
        batch.drop_column("effort")
        batch.drop_column("pool")
    op.drop_table("pool_sticky")
    op.drop_table("pool_cursors")
