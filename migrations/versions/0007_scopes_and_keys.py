"""scopes and gateway keys (issue 32, R-SC-1, R-SC-3)

Adds `reservation_scopes` (the scopes each reservation was granted under, with its creation time
for the scope's rolling windows), `scope_cost_hours` (each scope's cost per hour, as cost_hours),
`source_scopes` (the scopes `source add --scope` put a source
under) and `gateway_keys` (a salted hash of each key, never the key, with its name, scopes and
times). Existing reservations were granted under no scope: nothing to fill in. Downgrade drops
the four tables (scope limits and keys then no longer exist for the older code).

Revision ID: 0007
Revises: 0005
Create Date: 2026-12-01 19:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "reservation_scopes",
        sa.Column("reservation_id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=64), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["reservation_id"],
            ["reservations.id"],
            name=op.f("fk_reservation_scopes_reservation_id_reservations"),
        ),
        sa.PrimaryKeyConstraint("reservation_id", "scope", name=op.f("pk_reservation_scopes")),
    )
    op.create_index(
        "ix_reservation_scopes_window",
        "reservation_scopes",
        ["scope", "created_ms"],
        unique=False,
    )
    op.create_table(
        "scope_cost_hours",
        sa.Column("scope", sa.String(length=64), nullable=False),
        sa.Column("hour_start_ms", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("cost_micro", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "hour_start_ms % 3600000 = 0", name=op.f("ck_scope_cost_hours_hour_aligned")
        ),
        sa.PrimaryKeyConstraint("scope", "hour_start_ms", name=op.f("pk_scope_cost_hours")),
    )
    op.create_table(
        "source_scopes",
        sa.Column("source_id", sa.String(length=200), nullable=False),
        sa.Column("scope", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["source_id"], ["sources.id"], name=op.f("fk_source_scopes_source_id_sources")
        ),
        sa.PrimaryKeyConstraint("source_id", "scope", name=op.f("pk_source_scopes")),
    )
    op.create_table(
        "gateway_keys",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("salt", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.String(length=4000), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=True),
        sa.Column("revoked_ms", sa.BigInteger(), nullable=True),
        sa.Column("last_used_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_gateway_keys")),
        sa.UniqueConstraint("key_id", name=op.f("uq_gateway_keys_key_id")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("gateway_keys")
    op.drop_table("source_scopes")
    op.drop_table("scope_cost_hours")
    op.drop_index("ix_reservation_scopes_window", table_name="reservation_scopes")
    op.drop_table("reservation_scopes")
