"""settled index: a token window's overruns read from the rows settled inside it (R-TOK-3)

Adds the index `ix_reservations_settled` on `reservations (settled_ms, created_ms)`: the usage
above an estimate also counts at its settle time, and a reserve finds those rows by their settle
time instead of reading a day of grants. Nothing else changes.

Downgrade drops the index.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision: one plain CREATE INDEX (no table is rebuilt)."""
    op.create_index(
        "ix_reservations_settled", "reservations", ["settled_ms", "created_ms"], unique=False
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_reservations_settled", table_name="reservations")
