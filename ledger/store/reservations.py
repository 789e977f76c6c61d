"""Reserve and settle: each is exactly one write transaction (R-DB-2) that reads, decides, writes.

The rooms: `reserve` (the checks of R-RES-1..9 and R-SC-1 and the insert), `roles` (the role a
reserve records and the source's primary), `pool_choice` (a reserve through a pool, R-RT-4..6),
`settle` and `failure` (an outcome and the policy table's decision), `costs` (the hour totals every
cost write moves, so the rolling 24 h cost stays exact, R-RES-2), `usage` (the budgets' use).
This module keeps their public names in one place.
"""

from __future__ import annotations

from ledger.store.costs import add_hour_cost
from ledger.store.failure import STRIKE_WINDOW_MS, apply_to_source
from ledger.store.requests import DEFAULT_NAMESPACE, PoolPlan, ReserveRequest
from ledger.store.reserve import expire_open, insert_source, reserve
from ledger.store.roles import FOLLOW_UP_GRACE_MS
from ledger.store.settle import settle

__all__ = [
    "DEFAULT_NAMESPACE",
    "FOLLOW_UP_GRACE_MS",
    "STRIKE_WINDOW_MS",
    "PoolPlan",
    "ReserveRequest",
    "add_hour_cost",
    "apply_to_source",
    "expire_open",
    "insert_source",
    "reserve",
    "settle",
]
