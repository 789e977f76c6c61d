"""token seconds and minutes: a minute's token window from per-second totals, a day's partial
first hour from per-minute totals

A `tokensPerMinute` window (and its input and output kinds) used to read every grant of its
minute on each reserve: under a busy fleet thousands of rows a reserve, for each such window; a
`tokensPerDay` window read the grants of its partial first hour row by row.

- `token_seconds` (new): per second, model key and provider, the input and output tokens the
  reservations created in that second count, kept exactly as `token_hours` (revision 0015): reserve
  adds a grant's estimate, settle the difference its usage makes, in their write transactions.
- `scope_token_seconds` (new): the same per scope.
- `token_minutes`, `scope_token_minutes` (new): the same per minute.

Only the last two minutes of seconds and 25 hours of minutes are kept (a reserve that opens a
row deletes the older rows). Filled from the reservations of that span before the ledger's newest
time. Plain CREATE TABLE and CREATE INDEX: no table is rebuilt.

Downgrade drops them.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 20:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEPT_MS = 120_000
_MINUTES_KEPT_MS = 90_000_000  # 25 hours
_INPUT = (
    "(CASE WHEN r.input_tokens IS NULL THEN r.estimate_input_tokens ELSE r.input_tokens"
    " + coalesce(r.cache_read_tokens, 0) + coalesce(r.cache_write_tokens, 0) END)"
)
_OUTPUT = "coalesce(r.output_tokens, r.estimate_output_tokens)"
_SECOND = "(r.created_ms - r.created_ms % 1000)"
_SECOND_SCOPE = "(rs.created_ms - rs.created_ms % 1000)"
_MINUTE = "(r.created_ms - r.created_ms % 60000)"
_MINUTE_SCOPE = "(rs.created_ms - rs.created_ms % 60000)"


def _since(kept_ms: int, step: int) -> int:
    """The start of the kept rows: `kept_ms` before the start of the ledger's newest `step`."""
    bind = op.get_bind()
    newest = bind.execute(
        sa.text(
            "SELECT max(t) FROM (SELECT max(newest_ms) AS t FROM clock"
            " UNION ALL SELECT max(created_ms) AS t FROM reservations) AS times"
        )
    ).scalar()
    if newest is None:
        return 0
    cutoff = int(newest) - int(newest) % step - kept_ms
    return max(cutoff, 0)


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "token_seconds",
        sa.Column("second_ms", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("model_key", sa.String(300), nullable=False),
        sa.Column("provider", sa.String(100), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("second_ms % 1000 = 0", name="second_aligned"),
        sa.PrimaryKeyConstraint("second_ms", "model_key", "provider"),
    )
    op.create_index("ix_token_seconds_model", "token_seconds", ["model_key", "second_ms"])
    op.create_index("ix_token_seconds_provider", "token_seconds", ["provider", "second_ms"])
    op.create_table(
        "scope_token_seconds",
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("second_ms", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("second_ms % 1000 = 0", name="second_aligned"),
        sa.PrimaryKeyConstraint("scope", "second_ms"),
    )
    op.create_index("ix_scope_token_seconds_second", "scope_token_seconds", ["second_ms"])
    op.create_table(
        "token_minutes",
        sa.Column("minute_ms", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("model_key", sa.String(300), nullable=False),
        sa.Column("provider", sa.String(100), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("minute_ms % 60000 = 0", name="minute_aligned"),
        sa.PrimaryKeyConstraint("minute_ms", "model_key", "provider"),
    )
    op.create_index("ix_token_minutes_model", "token_minutes", ["model_key", "minute_ms"])
    op.create_index("ix_token_minutes_provider", "token_minutes", ["provider", "minute_ms"])
    op.create_table(
        "scope_token_minutes",
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("minute_ms", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("minute_ms % 60000 = 0", name="minute_aligned"),
        sa.PrimaryKeyConstraint("scope", "minute_ms"),
    )
    op.create_index("ix_scope_token_minutes_minute", "scope_token_minutes", ["minute_ms"])
    for table, scoped, time, step, kept, key, key_scope in (
        ("token_seconds", "scope_token_seconds", "second_ms", 1000, _KEPT_MS, _SECOND,
         _SECOND_SCOPE),
        ("token_minutes", "scope_token_minutes", "minute_ms", 60_000, _MINUTES_KEPT_MS, _MINUTE,
         _MINUTE_SCOPE),
    ):  # fmt: skip
        since = _since(kept, step)
        op.execute(
            f"INSERT INTO {table} ({time}, model_key, provider, input_tokens, output_tokens)"
            f" SELECT {key}, r.model_key, r.provider, sum({_INPUT}), sum({_OUTPUT})"
            f" FROM reservations r WHERE r.created_ms >= {since}"
            f" GROUP BY {key}, r.model_key, r.provider"
        )
        op.execute(
            f"INSERT INTO {scoped} (scope, {time}, input_tokens, output_tokens)"
            f" SELECT rs.scope, {key_scope}, sum({_INPUT}), sum({_OUTPUT})"
            " FROM reservation_scopes rs JOIN reservations r ON r.id = rs.reservation_id"
            f" WHERE rs.created_ms >= {since} GROUP BY rs.scope, {key_scope}"
        )


def downgrade() -> None:
    """Revert this revision."""
    for table in ("scope_token_minutes", "token_minutes", "scope_token_seconds", "token_seconds"):
        op.drop_table(table)
