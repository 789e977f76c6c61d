"""stored responses: who answered a stored Responses request (R-FMT-2)

Adds `stored_responses`: the response id, the provider and model key that answered it and when,
for each Responses request answered on a native route with `store` true or omitted, so that a
later `previous_response_id` request is pinned to that provider. Metadata only, never a body;
rows older than 30 days are deleted as new ones arrive. Nothing to fill in.

Downgrade drops the table.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 03:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "stored_responses",
        sa.Column("response_id", sa.String(length=200), nullable=False),
        sa.Column("provider", sa.String(length=100), nullable=False),
        sa.Column("model", sa.String(length=400), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("response_id", name=op.f("pk_stored_responses")),
    )
    op.create_index(
        "ix_stored_responses_created", "stored_responses", ["created_ms"], unique=False
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_stored_responses_created", table_name="stored_responses")
    op.drop_table("stored_responses")
