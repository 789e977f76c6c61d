"""token hours: a day's token window read from hour totals, its overruns from a small index

A `tokensPerDay` window used to read every grant of its day on each reserve (16,700 rows at a
million attempts over 60 days) and every reservation settled in the day for the overrun part.

- `token_hours` (new): per hour, model key and provider, the input and output tokens the
  reservations created in that hour count (their usage once settled with usage, prompt-cache
  tokens included on the input side, else their estimate). Reserve adds a grant's estimate and
  settle the difference its usage makes, in their write transactions, as `cost_hours` is kept.
- `scope_cost_hours` gains `input_tokens` and `output_tokens`, kept the same way per scope.
- `reservations.overrun_ms`: the settle time of a reservation whose usage went above its
  estimate (input or output), else NULL. The partial index `ix_reservations_overrun` holds only
  those rows, so the usage above estimates counted at its settle time is found without reading
  every settled row; it replaces `ix_reservations_settled` (revision 0014), which every settle
  wrote.

All three are filled in from the reservations already there. Plain CREATE TABLE, ADD COLUMN and
CREATE INDEX: no table is rebuilt.

Downgrade drops them and restores the settle-time index.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 17:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HOUR_MS = 3_600_000
_INPUT = (
    "(CASE WHEN r.input_tokens IS NULL THEN r.estimate_input_tokens ELSE r.input_tokens"
    " + coalesce(r.cache_read_tokens, 0) + coalesce(r.cache_write_tokens, 0) END)"
)
_OUTPUT = "coalesce(r.output_tokens, r.estimate_output_tokens)"
_OVERRAN = "overrun_ms IS NOT NULL"


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "token_hours",
        sa.Column("hour_start_ms", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("model_key", sa.String(300), nullable=False),
        sa.Column("provider", sa.String(100), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("hour_start_ms % 3600000 = 0", name="hour_aligned"),
        sa.PrimaryKeyConstraint("hour_start_ms", "model_key", "provider"),
    )
    hour = f"(r.created_ms - r.created_ms % {_HOUR_MS})"
    op.execute(
        "INSERT INTO token_hours (hour_start_ms, model_key, provider, input_tokens,"
        f" output_tokens) SELECT {hour}, r.model_key, r.provider, sum({_INPUT}), sum({_OUTPUT})"
        f" FROM reservations r GROUP BY {hour}, r.model_key, r.provider"
    )
    for name in ("input_tokens", "output_tokens"):
        op.add_column(
            "scope_cost_hours",
            sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        )
    for name, part in (("input_tokens", _INPUT), ("output_tokens", _OUTPUT)):
        op.execute(
            f"UPDATE scope_cost_hours SET {name} = (SELECT coalesce(sum({part}), 0)"
            " FROM reservation_scopes rs JOIN reservations r ON r.id = rs.reservation_id"
            " WHERE rs.scope = scope_cost_hours.scope"
            " AND rs.created_ms >= scope_cost_hours.hour_start_ms"
            f" AND rs.created_ms < scope_cost_hours.hour_start_ms + {_HOUR_MS})"
        )
    op.add_column("reservations", sa.Column("overrun_ms", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE reservations SET overrun_ms = settled_ms WHERE settled_ms IS NOT NULL AND ("
        f"{_INPUT.replace('r.', '')} > estimate_input_tokens"
        f" OR {_OUTPUT.replace('r.', '')} > estimate_output_tokens)"
    )
    op.drop_index("ix_reservations_settled", table_name="reservations")
    op.create_index(
        "ix_reservations_overrun",
        "reservations",
        ["overrun_ms", "created_ms"],
        sqlite_where=sa.text(_OVERRAN),
        postgresql_where=sa.text(_OVERRAN),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_reservations_overrun", table_name="reservations")
    op.create_index(
        "ix_reservations_settled", "reservations", ["settled_ms", "created_ms"], unique=False
    )
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 on, PostgreSQL): no table is rebuilt, so the
    # scope rows' foreign key to the reservations is never in the way
    for table, column in (
        ("reservations", "overrun_ms"),
        ("scope_cost_hours", "output_tokens"),
        ("scope_cost_hours", "input_tokens"),
    ):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    op.drop_table("token_hours")
