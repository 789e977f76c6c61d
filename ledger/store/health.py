"""Health counters per provider and per model (R-DIAG-6), written inside settle's transaction.

Invariant: for every target that has settled an attempt since the upgrade, the row holds the
failures in a row since its last success (cancellations are not failures), the last failure's
kind and time and the last success's time; a success resets the count.
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, insert, select, update

from ledger.kinds import CooldownScope
from ledger.store.hot import Hot
from ledger.store.schema import health

_BOTH = (
    (health.c.scope == CooldownScope.PROVIDER.value) & (health.c.target == bindparam("b_provider"))
) | ((health.c.scope == CooldownScope.MODEL.value) & (health.c.target == bindparam("b_model")))
_SUCCEEDED = update(health).where(_BOTH).values(
    consecutive_failures=0, last_success_ms=bindparam("b_now")
)
_FAILED = update(health).where(_BOTH).values(
    consecutive_failures=health.c.consecutive_failures + 1,
    last_failure_kind=bindparam("b_kind"),
    last_failure_ms=bindparam("b_now"),
)
_PRESENT = select(health.c.scope).where(_BOTH)
_HOT = {None: Hot(_SUCCEEDED), "failed": Hot(_FAILED)}


def record(conn: Connection, now: int, provider: str, model_key: str, kind: str | None) -> None:
    """One settled attempt on `model_key`: a success when `kind` is None, else a failure.

    One statement updates both rows (the common case on settle's hot path); a target seen for
    the first time gets its row inserted.
    """
    params = {"b_provider": provider, "b_model": model_key, "b_now": now, "b_kind": kind}
    if _HOT[None if kind is None else "failed"].rowcount(conn, params) == 2:
        return
    present = {str(s) for (s,) in conn.execute(_PRESENT, params)}
    for scope, target in ((CooldownScope.PROVIDER, provider), (CooldownScope.MODEL, model_key)):
        if scope.value in present:
            continue
        conn.execute(
            insert(health).values(
                scope=scope.value,
                target=target,
                consecutive_failures=0 if kind is None else 1,
                last_failure_kind=kind,
                last_failure_ms=None if kind is None else now,
                last_success_ms=now if kind is None else None,
            )
        )
