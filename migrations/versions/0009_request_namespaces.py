"""request namespaces: a request id is unique per namespace (issue M-hardening, R-SC-3a)

Adds `namespace` to `reservations` and makes `(namespace, request_id)` unique in place of
`request_id` alone. Every row there is in the default namespace `''` (the socket, the service
token, `/v1`, the CLI and the library share it), so each old request id keeps finding its
reservation; the gateway writes each key's ids under `key:NAME`.

On SQLite the table is rebuilt (a table's UNIQUE constraint cannot be dropped otherwise). Its
rebuild drops the old table, which with foreign keys on deletes its rows first: so the
`reservation_scopes` rows that point at them are set aside and put back around it, as they were.

Downgrade restores the unique request id: the gateway keys' request ids are forgotten (set to
NULL; two keys may have used the same one), the default namespace's stay.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "uq_reservations_request_id"
_NEW = "uq_reservations_namespace_request_id"
_HELD = "_held_reservation_scopes"


@contextmanager
def _scope_rows_set_aside() -> Iterator[None]:
    """SQLite: the rows pointing at `reservations` kept apart while it is rebuilt."""
    if op.get_bind().dialect.name != "sqlite":
        yield
        return
    op.execute(f"CREATE TEMP TABLE {_HELD} AS SELECT * FROM reservation_scopes")
    op.execute("DELETE FROM reservation_scopes")
    yield
    op.execute(
        "INSERT INTO reservation_scopes (reservation_id, scope, created_ms)"
        f" SELECT reservation_id, scope, created_ms FROM {_HELD}"
    )
    op.execute(f"DROP TABLE {_HELD}")


def upgrade() -> None:
    """Apply this revision."""
    with _scope_rows_set_aside(), op.batch_alter_table("reservations") as batch:
        batch.add_column(
            sa.Column("namespace", sa.String(length=100), server_default=sa.text("''"),
                      nullable=False)
        )  # fmt: skip
        batch.drop_constraint(_OLD, type_="unique")
        batch.create_unique_constraint(_NEW, ["namespace", "request_id"])


def downgrade() -> None:
    """Revert this revision."""
    op.execute("UPDATE reservations SET request_id = NULL WHERE namespace <> ''")
    with _scope_rows_set_aside(), op.batch_alter_table("reservations") as batch:
        batch.drop_constraint(_NEW, type_="unique")
        batch.create_unique_constraint(_OLD, ["request_id"])
        batch.drop_column("namespace")
