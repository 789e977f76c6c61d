"""follow-ups: a failed reservation stores the immediate follow-up it permits (issue 12 item 6)

Adds two nullable columns to `reservations`: `follow_up` (on a failed reservation: `fallback` or
`correction`, the one immediate follow-up its policy decision permitted; NULL: none) and
`after_id` (on a reservation granted as that follow-up: the failed reservation it follows).
Existing rows keep NULL in both: a failure recorded before the upgrade permits no `after=`
follow-up (it waits for its backoff like any reserve). Downgrade drops the columns; the rows stay.

Revision ID: 0003b
Revises: 0002
Create Date: 2026-12-01 03:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003b"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(sa.Column("follow_up", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("after_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("after_id")
        batch.drop_column("follow_up")
