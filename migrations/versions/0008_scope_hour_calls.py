"""scope hour calls: each scope's calls per hour beside its cost (issue 32, R-SC-1)

Adds `calls` to `scope_cost_hours`: how many reservations of the scope were created in the hour.
A scope's rolling-hour count then reads the totals from the window's first whole hour on and only
the rows of the partial hour before it, as its 24 h cost already does, instead of every row of
the hour. Filled in from `reservation_scopes` for the hours already there; an hour that has scope
rows but no totals row (none is written without one, but a hand-edited file may lack it) gets one,
its cost summed from the reservations.

`ix_reservation_scopes_window` now leads with the creation time, then the scope (and the
reservation, so the partial hour's cost is read without the table): a grant under N scopes
writes its N index entries side by side on one page instead of one page per scope. On SQLite
the table is rebuilt WITHOUT ROWID (its primary key is the table), one b-tree less per grant.

Downgrade drops the column and restores the index; the rows stay.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 02:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HOUR_MS = 3_600_000


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("scope_cost_hours") as batch:
        batch.add_column(
            sa.Column("calls", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
        )
    op.drop_index("ix_reservation_scopes_window", table_name="reservation_scopes")
    if op.get_bind().dialect.name == "sqlite":  # the table is its primary key: one b-tree less
        with op.batch_alter_table(
            "reservation_scopes", recreate="always", table_kwargs={"sqlite_with_rowid": False}
        ):
            pass
    op.create_index(
        "ix_reservation_scopes_window",
        "reservation_scopes",
        ["created_ms", "scope", "reservation_id"],
    )
    hour = f"(rs.created_ms - rs.created_ms % {_HOUR_MS})"
    op.execute(  # an hour with scope rows and no totals row: its cost summed from the rows
        "INSERT INTO scope_cost_hours (scope, hour_start_ms, cost_micro, calls)"
        f" SELECT rs.scope, {hour}, coalesce(sum(r.cost_micro), 0), 0"
        " FROM reservation_scopes rs JOIN reservations r ON r.id = rs.reservation_id"
        " WHERE NOT EXISTS (SELECT 1 FROM scope_cost_hours h"
        f" WHERE h.scope = rs.scope AND h.hour_start_ms = {hour})"
        f" GROUP BY rs.scope, {hour}"
    )
    op.execute(
        "UPDATE scope_cost_hours SET calls = (SELECT count(*) FROM reservation_scopes rs"
        " WHERE rs.scope = scope_cost_hours.scope"
        " AND rs.created_ms >= scope_cost_hours.hour_start_ms"
        f" AND rs.created_ms < scope_cost_hours.hour_start_ms + {_HOUR_MS})"
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_reservation_scopes_window", table_name="reservation_scopes")
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table(
            "reservation_scopes", recreate="always", table_kwargs={"sqlite_with_rowid": True}
        ):
            pass
    op.create_index(
        "ix_reservation_scopes_window", "reservation_scopes", ["scope", "created_ms"]
    )
    with op.batch_alter_table("scope_cost_hours") as batch:
        batch.drop_column("calls")
