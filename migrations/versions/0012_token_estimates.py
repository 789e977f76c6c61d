"""token estimates: each reservation's input and reply token estimate (R-TOK-2)

Adds `estimate_input_tokens` and `estimate_output_tokens` to `reservations`: what a token window
(SPEC section 22) counts for a reservation until it settles with usage. Rows made before this
revision get the input bound of their stored input size (one token per 3 bytes, rounded up, the
most R-SEL-8's estimate can be for that size) and no reply estimate: the reply allowance they were
granted was not stored, and a token window counts their usage once they settle.

Downgrade drops the two columns.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 03:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision: two plain ADD COLUMNs (a constant default needs no table rebuild,
    so rows pointing at `reservations` stay where they are)."""
    for name in ("estimate_input_tokens", "estimate_output_tokens"):
        op.add_column(
            "reservations",
            sa.Column(name, sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        )
    op.execute("UPDATE reservations SET estimate_input_tokens = (input_bytes + 2) / 3")


def downgrade() -> None:
    """Revert this revision (ALTER TABLE DROP COLUMN: SQLite 3.35 and later, PostgreSQL)."""
    op.drop_column("reservations", "estimate_output_tokens")
    op.drop_column("reservations", "estimate_input_tokens")
