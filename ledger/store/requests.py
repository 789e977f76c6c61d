"""What a reserve is asked (R-RES-1..9, R-RT-4, R-SC-1, R-SC-3a) and the record its row reads
as."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Row,
    bindparam,
    select,
)

from ledger.catalog import Model
from ledger.kinds import (
    AttemptRole,
    AttemptStatus,
)
from ledger.records import Reservation
from ledger.store.schema import (
    reservations,
)

DEFAULT_NAMESPACE = ""
"""The request ids of the socket, the service token, /v1, the CLI and the library (R-SC-3a)."""

# Hot-path statements, built once (construction and cache-key work is most of the Python cost).
BY_REQUEST_ID = select(reservations).where(
    reservations.c.namespace == bindparam("b_namespace"),
    reservations.c.request_id == bindparam("request_id"),
)


@dataclass(frozen=True)
class ReserveRequest:
    """One request for call authority."""

    source_id: str
    model: Model
    input_bytes: int
    request_id: str | None = None
    override: bool = False
    role: AttemptRole = AttemptRole.PRIMARY
    fallback_from: str | None = None
    # the failed reservation this immediate follow-up (fallback or correction) comes after
    immediate_after: int | None = None
    # the source must exist already (`source evolve`: an override of a known source, never a
    # new source made by a mistyped id)
    existing: bool = False
    effort: str | None = None  # the route's reasoning effort, recorded with the reservation
    # through a pool (R-RT-4): the reserve picks the concrete candidate (`model` is then only
    # the pool's first candidate, never used for the grant)
    pool: PoolPlan | None = None
    via_pool: str | None = None  # set on the concrete request a pool choice makes
    sticky_scope: str | None = None
    # the scopes the caller puts this reservation under (R-SC-1; the source's own are added)
    scopes: tuple[str, ...] = ()
    # the gateway key that sent it (R-SC-3a; `scopes` are then the key's): its request ids are
    # its own namespace, and it may name only a source wholly inside its scopes, or a new one
    gateway_key: str | None = None

    @property
    def namespace(self) -> str:
        """Where the request id is unique: each gateway key's own, else the default one."""
        return DEFAULT_NAMESPACE if self.gateway_key is None else f"key:{self.gateway_key}"


@dataclass(frozen=True)
class PoolPlan:
    """A reserve through `pool/NAME`: the pool's name, its route's effort (a candidate's own
    wins) and the concrete candidates that can be called at all (available, with text, allowed by
    the route rules, fitting the request), with their prompt-cache lifetimes (R-RT-6)."""

    pool: str
    models: Mapping[str, Model]
    effort: str | None = None
    cache_ttl_ms: Mapping[str, int] = field(default_factory=dict)


def to_reservation(row: Row[Any], replayed: bool = False) -> Reservation:
    r = row._mapping
    return Reservation(
        id=int(r["id"]),
        source=str(r["source_id"]),
        model=str(r["model_key"]),
        created_ms=int(r["created_ms"]),
        deadline_ms=int(r["deadline_ms"]),
        estimate_micro=r["estimate_micro"],
        role=AttemptRole(r["role"]),
        status=AttemptStatus(r["status"]),
        request_id=r["request_id"],
        replayed=replayed,
        pool=r["pool"],
        effort=r["effort"],
        estimate_input_tokens=int(r["estimate_input_tokens"]),
        estimate_output_tokens=int(r["estimate_output_tokens"]),
    )
