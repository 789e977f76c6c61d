"""Read-only view of routing state (R-RT-7): pool cursors and sticky leases, in one short
deferred read transaction."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from ledger.store.engine import Database
from ledger.store.schema import pool_cursors, pool_sticky


@dataclass(frozen=True)
class LeaseRow:
    """A sticky lease as stored (whether it still holds depends on the pool's sticky mode)."""

    pool: str
    scope: str
    model_key: str
    chosen_ms: int
    success_ms: int | None


@dataclass(frozen=True)
class PoolStateRows:
    """Ledger time, each pool's cursor and every lease row."""

    now_ms: int
    cursors: dict[str, int]
    leases: tuple[LeaseRow, ...]


def pool_state(db: Database) -> PoolStateRows:
    """Cursors and leases, read together."""
    if db.pending:  # no database yet: nothing recorded
        return PoolStateRows(db.clock_fn(), {}, ())
    with db.read() as conn:
        now = db.read_now(conn)
        cursors = {str(p): int(n) for p, n in conn.execute(select(pool_cursors.c.pool,
                                                                  pool_cursors.c.position))}
        leases = tuple(
            LeaseRow(str(r.pool), str(r.scope), str(r.model_key), int(r.chosen_ms), r.success_ms)
            for r in conn.execute(select(pool_sticky).order_by(pool_sticky.c.pool,
                                                               pool_sticky.c.scope))
        )
    return PoolStateRows(now, cursors, leases)
