"""cost hours: per-hour cost totals for the rolling 24 h ceiling, backfilled (R-RES-2, R-DB-5)

Adds `cost_hours` (one row per UTC hour that holds reservations: their SUM(cost_micro), NULL
counted as 0, and COUNT(*)), then fills it from every existing reservation, so the bucketed
rolling sum equals the plain SUM from the first read after the upgrade. Downgrade drops it (the
reservations themselves are untouched either way).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 23:08:32.207060
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HOUR_MS = 3_600_000


def upgrade() -> None:
    """Apply this revision."""
    cost_hours = op.create_table(
        "cost_hours",
        sa.Column("hour_start_ms", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("cost_micro", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.CheckConstraint("hour_start_ms % 3600000 = 0", name=op.f("ck_cost_hours_hour_aligned")),
        sa.PrimaryKeyConstraint("hour_start_ms", name=op.f("pk_cost_hours")),
    )
    # data: every existing reservation's cost into the hour it was created in (times are >= 0)
    reservations = sa.table(
        "reservations",
        sa.column("created_ms", sa.BigInteger()),
        sa.column("cost_micro", sa.BigInteger()),
    )
    hour = (reservations.c.created_ms - reservations.c.created_ms % HOUR_MS).label("hour")
    per_hour = sa.select(
        hour,
        sa.func.coalesce(sa.func.sum(reservations.c.cost_micro), 0),
        sa.func.count(),
    ).group_by(hour)
    op.execute(
        sa.insert(cost_hours).from_select(["hour_start_ms", "cost_micro", "attempts"], per_hour)
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("cost_hours")
