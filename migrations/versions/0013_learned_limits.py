"""learned limits: the token limits providers report on their answers (R-TOK-4)

Adds `learned_limits`: per (provider, upstream model id) and kind of token limit, what the last
answer's rate-limit headers said was left, when that was read and when the limit resets. Nothing
to fill in: no answer's headers were kept before.

Downgrade drops the table.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 06:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision: one new table (no existing table is touched)."""
    op.create_table(
        "learned_limits",
        sa.Column("provider", sa.String(length=100), nullable=False),
        sa.Column("model_id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("remaining", sa.BigInteger(), nullable=False),
        sa.Column("limit_tokens", sa.BigInteger(), nullable=True),
        sa.Column("read_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("reset_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("provider", "model_id", "kind", name=op.f("pk_learned_limits")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("learned_limits")
