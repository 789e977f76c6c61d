"""What `ledger pool`, `status` and the page show of pools (R-RT-7): strategy, cursor, each
candidate's state and reason (from one selection through the pool), and the live sticky leases;
and `pool cycle`, which cools a pool's current pick by hand (R-POL-8) so the pool moves on."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ledger.errors import UsageError
from ledger.kinds import CooldownScope
from ledger.routing import pools
from ledger.store.pool_views import PoolStateRows, pool_state
from ledger.store.views import CooldownChange
from ledger.targets import pool_key

if TYPE_CHECKING:
    from ledger.api import Ledger


def _view(ledger: Ledger, name: str, state: PoolStateRows) -> pools.PoolView:
    key = pool_key(name)
    selection = ledger.select(None, model=key)
    view = next((v for v in selection.pools if v.name == name), None)
    if view is None:  # pragma: no cover - select always views the pool it was asked for
        raise UsageError("unknown pool: not in the policy's `pools`")
    spec = pools.spec_of(ledger.policy, name)
    leases = tuple(
        pools.Lease(row.pool, row.scope, row.model_key, until)
        for row in state.leases
        if row.pool == name
        and (until := pools.sticky_until(
            spec.sticky, row.chosen_ms, row.success_ms,
            pools.cache_ttl_ms(ledger.catalog, row.model_key),
        )) != -1
        and (until is None or until > state.now_ms)
    )  # fmt: skip
    return replace(view, cursor=state.cursors.get(name), leases=leases)


def pool_views(ledger: Ledger) -> list[pools.PoolView]:
    """Every pool of the policy, in file order."""
    state = pool_state(ledger.db)
    return [_view(ledger, name, state) for name in ledger.policy.pools]


def pool_view_named(ledger: Ledger, name: str) -> pools.PoolView:
    """One pool (a usage error, never echoing the name, when the policy has none by it)."""
    if name.removeprefix("pool/") not in ledger.policy.pools:
        raise UsageError("unknown pool: not in the policy's `pools`")
    return _view(ledger, name.removeprefix("pool/"), pool_state(ledger.db))


def current_pick(view: pools.PoolView) -> str | None:
    """The candidate the pool is on: a pool-wide lease's, else the round-robin cursor's while it
    is eligible, else the first eligible candidate (tier order)."""
    eligible = [c for c in view.candidates if c.state == "eligible" and not c.is_pool]
    pool_wide = next((lease.model for lease in view.leases if lease.scope == ""), None)
    if pool_wide is not None and any(c.key == pool_wide for c in eligible):
        return pool_wide
    cursor = view.cursor
    if view.strategy == "round-robin" and cursor is not None and cursor < len(view.candidates):
        on = view.candidates[cursor]
        if on.state == "eligible" and not on.is_pool:
            return on.key
    ordered = sorted(eligible, key=lambda c: c.tier)
    return ordered[0].key if ordered else None


def cycle_pool(ledger: Ledger, name: str, duration_ms: int) -> tuple[str, CooldownChange]:
    """Cool the pool's current pick for `duration_ms` (a manual model cooldown) and return it;
    the next reservation through the pool skips it (R-RT-7)."""
    view = pool_view_named(ledger, name)
    pick = current_pick(view)
    if pick is None:
        raise UsageError("this pool has no eligible candidate to cycle")
    change = ledger.store.set_cooldown(CooldownScope.MODEL, pick, duration_ms, "pool cycle")
    return pick, change
