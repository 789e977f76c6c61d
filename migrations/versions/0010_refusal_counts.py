"""refusal counts: refusals per minute, reason, scope and gateway key (R-DIAG-1)

Adds `refusal_minutes`: how many requests a service refused in each minute, by reason code, the
scope that refused ('' when none) and the gateway key that asked ('' when none). Status shows the
last hour of them. Nothing to fill in: refusals were never recorded before.

Downgrade drops the table.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 21:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "refusal_minutes",
        sa.Column("minute_ms", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=64), nullable=False),
        sa.Column("key_name", sa.String(length=64), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "minute_ms % 60000 = 0", name=op.f("ck_refusal_minutes_minute_aligned")
        ),
        sa.PrimaryKeyConstraint(
            "minute_ms", "reason", "scope", "key_name", name=op.f("pk_refusal_minutes")
        ),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("refusal_minutes")
