"""probes and health: recovery probes, their escalation streak, health counters (issue 24)

Adds `probes` (one row per provider or model whose policy or hint cooldown ends with a recovery
probe: the consecutive failed-probe streak and the reservation that is the probe in flight), then
arms every target whose policy or hint cooldown is still running at the upgrade (it ends after the
newest time the ledger stored), so a cooldown set before the upgrade also ends with one probe
rather than a herd. Adds `health` (per provider and per model: failures in a row, the last failure
kind and time, the last success; R-DIAG-6), which settle keeps from the upgrade on (it starts
empty: status shows earlier attempts in its last-hour counts only). Downgrade drops both tables
(cooldowns then end as before, without a probe).

Revision ID: 0005
Revises: 0003b
Create Date: 2026-12-01 09:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    probes = op.create_table(
        "probes",
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=300), nullable=False),
        sa.Column("streak", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("holder_id", sa.Integer(), nullable=True),
        sa.Column("holder_deadline_ms", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("scope IN ('provider', 'model')", name=op.f("ck_probes_scope")),
        sa.PrimaryKeyConstraint("scope", "target", name=op.f("pk_probes")),
    )
    op.create_index("ix_probes_holder", "probes", ["holder_id"], unique=False)
    op.create_table(
        "health",
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=300), nullable=False),
        sa.Column(
            "consecutive_failures", sa.Integer(), server_default=sa.text("0"), nullable=False
        ),
        sa.Column("last_failure_kind", sa.String(length=32), nullable=True),
        sa.Column("last_failure_ms", sa.BigInteger(), nullable=True),
        sa.Column("last_success_ms", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("scope IN ('provider', 'model')", name=op.f("ck_health_scope")),
        sa.PrimaryKeyConstraint("scope", "target", name=op.f("pk_health")),
    )
    # data: arm every target whose policy or hint cooldown is still running at the upgrade
    cooldowns = sa.table(
        "cooldowns",
        sa.column("scope", sa.String()),
        sa.column("target", sa.String()),
        sa.column("origin", sa.String()),
        sa.column("until_ms", sa.BigInteger()),
    )
    clock = sa.table("clock", sa.column("newest_ms", sa.BigInteger()))
    newest = sa.select(sa.func.coalesce(sa.func.max(clock.c.newest_ms), 0)).scalar_subquery()
    running = (
        sa.select(cooldowns.c.scope, cooldowns.c.target)
        .where(cooldowns.c.origin.in_(("policy", "hint")), cooldowns.c.until_ms > newest)
        .distinct()
    )
    op.execute(sa.insert(probes).from_select(["scope", "target"], running))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("health")
    op.drop_index("ix_probes_holder", table_name="probes")
    op.drop_table("probes")
