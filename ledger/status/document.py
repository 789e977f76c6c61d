"""The status document (R-DIAG-1, R-DIAG-2): one read of the ledger, rendered as JSON, text or
Prometheus exposition.

Invariant: the document holds only ledger facts (model keys, source ids, reason codes, counts,
times, money) and never configuration values, credentials, provider error bodies or model text
(R-DIAG-3). `status_document` and the renderers (`status.text`, `status.prometheus`, re-exported
here) are pure; `build_status` is the only I/O.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ledger.api import Ledger
from ledger.budgets.checks import DAY_MS, HOUR_MS
from ledger.budgets.scopes import ScopeUse
from ledger.clock import human_duration_ms, iso
from ledger.config import Policy, ScopeLimits
from ledger.inert import ConfigFindings, config_findings
from ledger.records import micro_to_usd
from ledger.routing.select import exclusion_json
from ledger.status.prometheus import render_prometheus, render_prometheus_down
from ledger.status.text import render_text
from ledger.store.engine import network_filesystem
from ledger.store.learned import LiveLimit
from ledger.store.pending import no_database_yet
from ledger.store.refusal_counts import WINDOW_MS, RefusalTotal
from ledger.store.status_views import (
    HOURS,
    HourOutcome,
    PolicyWriter,
    QueueData,
    QueuedRow,
    StatusData,
    status_data,
)
from ledger.store.token_views import TokenWindowUse

SCHEMA_VERSION = 1
__all__ = [
    "RouteView",
    "build_status",
    "fresh_routes",
    "render_prometheus",
    "render_prometheus_down",
    "render_text",
    "status_document",
]


@dataclass(frozen=True)
class RouteView:
    """The routes a fresh source would get (R-SEL-2..6), and every exclusion with its reason."""

    routes: tuple[str, ...]
    excluded: tuple[dict[str, object], ...]  # {model, reason, until[, credential_env]}
    retry_at_ms: int | None = None
    by_reason: dict[str, int] = field(default_factory=dict)  # counts, in the selector's order


def build_status(ledger: Ledger, *, from_shell: bool = False) -> dict[str, Any]:
    """Read the ledger once (one read transaction) and build the whole status document.

    `from_shell`: built by a command in an operator's shell, which says (`service_elsewhere`) when a
    `ledger serve` runs on the same state directory: it reads its own environment, so a credential
    variable missing here may well be set there."""
    data = status_data(ledger.db, ledger.policy.calls_per_hour, ledger.policy)
    path = ledger.state.db_path
    fs = network_filesystem(path) if path is not None else None
    config = config_findings(ledger.policy, ledger.catalog, ledger.env)
    if ledger.db.pending:  # nothing recorded yet: read as an empty ledger, and said so
        data = replace(data, journal_mode=None, revision=None)
    doc = status_document(
        data, ledger.policy, ledger.fingerprint, fresh_routes(ledger), fs, config
    )
    if ledger.db.pending:
        doc["warnings"].insert(0, no_database_yet(path))
    doc["service_elsewhere"] = from_shell and service_running(ledger.state.path)
    if ledger.policy.pools:  # R-RT-7: strategy, cursor, candidates with state, live leases
        from ledger.status.pools import pool_views  # lazy: only pools pay (status start-up)

        doc["pools"] = [view.to_json() for view in pool_views(ledger)]
    return doc


SOCKET_NAME = "ledger.sock"  # the service's socket in the state directory (service/server.py)


def service_running(state: Path) -> bool:
    """Whether a `ledger serve` answers on the state directory's socket (a connection it accepts
    and sees closed at once; its lock file is never touched, so a service starting meanwhile is
    never refused for it). A stale socket file, or none, is no service."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(str(state / SOCKET_NAME))
    except OSError:
        return False
    finally:
        sock.close()
    return True


def fresh_routes(ledger: Ledger) -> RouteView:
    """The selector's answer for a fresh source with no failure and nothing tried."""
    selection = ledger.select(None)
    return RouteView(
        routes=selection.routes,
        excluded=tuple(
            {**exclusion_json(e, ledger.catalog), "until": iso(e.until_ms)}
            for e in selection.excluded
        ),
        retry_at_ms=selection.retry_at_ms,
        by_reason=selection.excluded_by_reason(),
    )


def _usd(micro: int) -> float:
    value = micro_to_usd(micro)
    return 0.0 if value is None else value


def hours_24(now: int, rows: Iterable[HourOutcome]) -> list[dict[str, Any]]:
    """The rolling 24 h window per hour, oldest first (always 24 entries): attempts, successes,
    failures by kind, other outcomes (open, cancelled, expired) and cost, as the daily budget
    counts it; the hours add up to `daily`."""
    start = now - DAY_MS
    out: list[dict[str, Any]] = [
        {
            "start": iso(start + i * HOUR_MS),
            "end": iso(start + (i + 1) * HOUR_MS),
            "attempts": 0,
            "succeeded": 0,
            "failed": {},
            "other": 0,
            "spent_usd": 0.0,
            "unknown_cost_attempts": 0,
        }
        for i in range(HOURS)
    ]
    micro = [0] * HOURS
    for row in rows:
        hour = out[row.hour]
        hour["attempts"] += row.count
        hour["unknown_cost_attempts"] += row.unknown_cost
        micro[row.hour] += row.cost_micro
        if row.status == "succeeded":
            hour["succeeded"] += row.count
        elif row.status == "failed":
            kind = row.kind or "unknown"
            hour["failed"][kind] = hour["failed"].get(kind, 0) + row.count
        else:
            hour["other"] += row.count
    for hour, cost in zip(out, micro, strict=True):
        hour["spent_usd"] = _usd(cost)
        hour["failed"] = dict(sorted(hour["failed"].items()))
    return out


def _waits(
    row: QueuedRow, now: int, routes: RouteView, hourly_next_free_ms: int | None, daily_full: bool
) -> str:
    """Why a queued source is not being worked right now, as a code the page and text explain:
    `leased` (a worker holds it), `retry_later` (its retry time is ahead), or, when it is due,
    what stops a claim from using it: `no_route`, `hourly_budget`, `daily_ceiling`, else
    `waiting_for_worker` (nothing stops it; no worker has claimed it yet)."""
    if row.state == "leased" and (row.lease_expires_ms or 0) > now:
        return "leased"
    if row.retry_at_ms is not None and row.retry_at_ms > now:
        return "retry_later"
    if not routes.routes:
        return "no_route"
    if hourly_next_free_ms is not None:
        return "hourly_budget"
    if daily_full:
        return "daily_ceiling"
    return "waiting_for_worker"


def queue_json(
    queue: QueueData | None,
    now: int,
    routes: RouteView,
    hourly_next_free_ms: int | None,
    daily_full: bool,
) -> dict[str, Any]:
    """The worker queue block of the document: due now, next due, the oldest few and why each
    waits (R-Q-2 claim order)."""
    queue = queue or QueueData(0, None, [])
    return {
        "due_now": queue.due_now,
        "next_due_at": iso(queue.next_due_ms),
        "oldest": [
            {
                "id": row.id,
                "state": row.state,
                "last_checked": iso(row.last_checked_ms),
                "retry_at": iso(row.retry_at_ms),
                "lease_expires": iso(row.lease_expires_ms),
                "waits": _waits(row, now, routes, hourly_next_free_ms, daily_full),
            }
            for row in queue.oldest
        ],
    }


LIVE_WRITER_MS = 15 * 60_000
"""How recently another policy's stamp must be for its process to count as still running."""


def live_other_writers(writers: Sequence[PolicyWriter], fingerprint: str, now: int) -> set[str]:
    """Fingerprints other than `fingerprint` whose process is still running, as far as the
    reservations' stamps can tell (R-HOME-3; issue 33): a stamp within the last LIVE_WRITER_MS
    and, once this policy has stamped anything, after its first stamp. A process that wrote
    under the old recovery.json and exited (every CLI command) stops counting as soon as a
    command under the new one has written, or LIVE_WRITER_MS after its last stamp; a worker or
    service still running the old file keeps stamping and keeps being shown."""
    first_current = next((w.first_seen_ms for w in writers if w.fingerprint == fingerprint), None)
    return {
        w.fingerprint
        for w in writers
        if w.fingerprint != fingerprint
        and w.last_seen_ms > now - LIVE_WRITER_MS
        and (first_current is None or w.last_seen_ms > first_current)
    }


def status_document(
    data: StatusData,
    policy: Policy,
    fingerprint: str,
    routes: RouteView,
    network_fs: str | None,
    config: ConfigFindings | None = None,
) -> dict[str, Any]:
    """The stable JSON shape of `ledger status --json` (documented in the README)."""
    now = data.now_ms
    ceiling = policy.daily_estimated_usd
    config = config or ConfigFindings()
    ordered = sorted(data.writers, key=lambda w: (-w.last_seen_ms, w.fingerprint))
    live = live_other_writers(data.writers, fingerprint, now)
    writers: list[dict[str, Any]] = [
        {
            "fingerprint": w.fingerprint,
            "last_seen": iso(w.last_seen_ms),
            "reservations": w.reservations,
            "current": w.fingerprint == fingerprint,
            "live": w.fingerprint in live,
        }
        for w in ordered
    ]
    stale = [w.fingerprint for w in ordered if w.fingerprint in live]
    policy_warning = (
        f"a process still writes reservations under another policy ({', '.join(stale)}; "
        f"within the last {human_duration_ms(LIVE_WRITER_MS)}, after this policy's first): "
        "restart processes that still run an old recovery.json"
        if stale
        else None
    )
    fs_warning = (
        f"the database is on a network filesystem ({network_fs}); "
        "SQLite locking is not reliable there"
        if network_fs
        else None
    )
    return {
        "schema": SCHEMA_VERSION,
        "now": iso(now),
        "default_model": policy.default_model,
        "routes": list(routes.routes),
        "excluded": list(routes.excluded),
        "excluded_by_reason": dict(routes.by_reason),
        "routes_retry_at": iso(routes.retry_at_ms),
        "cooldowns": [
            c.to_json(now)
            for c in data.cooldowns
        ],
        "health": [h.to_json() for h in data.health],
        "hourly": {
            "used": data.hourly_used,
            "limit": policy.calls_per_hour,
            "next_free_at": iso(data.hourly_next_free_ms),
        },
        "daily": {
            "window_hours": 24,
            "attempts": data.daily.attempts,
            "spent_usd": _usd(data.daily.spent_micro),
            "ceiling_usd": ceiling,
            "unknown_cost_attempts": data.daily.unknown_cost_attempts,
            "input_tokens": data.daily.input_tokens,
            "output_tokens": data.daily.output_tokens,
            "cache_write_tokens": data.daily.cache_write_tokens,
            "cache_read_tokens": data.daily.cache_read_tokens,
        },
        "history": [
            {
                "day": d.day,
                "attempts": d.attempts,
                "succeeded": d.succeeded,
                "failed": d.failed,
                "input_tokens": d.input_tokens,
                "output_tokens": d.output_tokens,
                "cache_write_tokens": d.cache_write_tokens,
                "cache_read_tokens": d.cache_read_tokens,
                "spent_usd": _usd(d.cost_micro),
                "unknown_cost_attempts": d.unknown_cost,
            }
            for d in data.history
        ],
        "sources": {
            "counts": data.source_counts,
            "list": [
                {
                    "id": s.id,
                    "state": s.state,
                    "calls": s.calls,
                    "models": list(s.models),
                    "failures": s.failures,
                    "output_failures": s.output_failures,
                    "time_used_ms": s.time_used_ms,
                    "open_allowance_ms": s.open_allowance_ms,
                    "pause_reason": s.pause_reason,
                    "retry_at": iso(s.retry_at_ms),
                    "lease_expires": iso(s.lease_expires_ms),
                }
                for s in data.sources
            ],
        },
        "recent": [
            {
                "id": a.id,
                "time": iso(a.created_ms),
                "source": a.source_id,
                "model": a.model_key,
                "role": a.role,
                "status": a.status,
                "kind": a.kind,
                "subkind": a.subkind,
                "duration_ms": a.duration_ms,
                "late": a.late,
            }
            for a in data.recent
        ],
        "outcomes_24h": [
            {
                "provider": o.provider,
                "model": o.model_key,
                "status": o.status,
                "kind": o.kind,
                "count": o.count,
            }
            for o in data.outcomes
        ],
        "hours_24": hours_24(now, data.hours),
        "queue": queue_json(
            data.queue,
            now,
            routes,
            data.hourly_next_free_ms,
            ceiling is not None and _usd(data.daily.spent_micro) >= ceiling,
        ),
        "failovers": [
            {
                "time": iso(f.created_ms),
                "source": f.source_id,
                "from": f.from_model,
                "to": f.to_model,
                "kind": f.kind,
                "status": f.status,
            }
            for f in data.failovers
        ],
        "notices": [
            {
                "category": n.category,
                "message": n.message,
                "source": n.source_id,
                "first": iso(n.first_ms),
                "last": iso(n.last_ms),
                "count": n.count,
            }
            for n in data.notices
        ],
        "store": {
            "backend": data.backend,
            "sqlite_library": data.sqlite_library,
            "sqlite_version": data.sqlite_version,
            "journal_mode": data.journal_mode,
            "journal_mode_chosen": data.journal_mode_chosen,
            "revision": data.revision,
            "network_filesystem": fs_warning,
        },
        "policy": {"fingerprint": fingerprint, "writers": writers, "warning": policy_warning},
        "scopes": scopes_json(data.scopes, policy),
        "refusals": refusals_json(data.refusals),
        "token_budgets": token_budgets_json(data.token_budgets),
        "learned_limits": learned_limits_json(data.learned_limits),
        "service_elsewhere": False,
        "inert": [entry.to_json() for entry in config.inert],
        "warnings": [w for w in (policy_warning, fs_warning) if w] + config.warnings(),
    }


def token_budgets_json(uses: Iterable[TokenWindowUse]) -> list[dict[str, Any]]:
    """R-TOK-5: each configured token window's use against its limit; `target` names a provider,
    model key or glob (`kind` says which) or is null for a scope's window (`scope` names it);
    `frees_at` is when its first counted part leaves the window (null when it holds nothing)."""
    return [
        {
            "target": None if u.kind == "scope" else u.name,
            "scope": u.name if u.kind == "scope" else None,
            "kind": u.kind,
            "window": u.window,
            "limit": u.limit,
            "used": u.used,
            "frees_at": iso(u.frees_at_ms),
        }
        for u in uses
    ]


def learned_limits_json(live: Iterable[LiveLimit]) -> list[dict[str, Any]]:
    """R-TOK-4, R-TOK-5: each live reading of a provider's token limit: what its answer reported
    left (`remaining`, of `limit` when it said), what is left for the next reservation (`left`:
    less the estimates granted on the model since), when it was read and when it resets."""
    return [
        {
            "model": x.model_key,
            "kind": x.kind.value,
            "remaining": x.remaining,
            "left": x.left,
            "limit": x.limit,
            "read_at": iso(x.read_at_ms),
            "resets_at": iso(x.reset_ms),
        }
        for x in live
    ]


def refusals_json(rows: Iterable[RefusalTotal]) -> dict[str, Any]:
    """R-DIAG-1: the last hour's refusals by a service, per reason code, the scope that refused and
    the gateway key that asked (null when none), the most frequent first."""
    by = [
        {"reason": r.reason, "scope": r.scope or None, "key": r.key_name or None,
         "count": r.count, "last_minute": iso(r.last_minute_ms)}
        for r in rows
    ]  # fmt: skip
    return {"window_minutes": WINDOW_MS // 60_000, "total": sum(r["count"] for r in by), "by": by}


def _full(use: ScopeUse, limits: ScopeLimits) -> list[str]:
    """The limits a scope is at (R-DIAG-1): its next request of that kind is refused."""
    full = []
    if limits.calls_per_hour is not None and use.hourly_count >= limits.calls_per_hour:
        full.append("hourly")
    ceiling = limits.daily_estimated_usd
    if ceiling is not None and _usd(use.daily_cost_micro) >= ceiling:
        full.append("daily")
    if limits.in_flight is not None and use.in_flight >= limits.in_flight:
        full.append("in_flight")
    return full


def scopes_json(uses: Iterable[ScopeUse], policy: Policy) -> list[dict[str, Any]]:
    """Each scope's use against its limits (R-SC-2); a limit the scope does not set is null, and
    `next_free_at` is set when that part is full (the earliest time a slot frees); `full` lists
    the limits the scope is at (`hourly`, `daily`, `in_flight`)."""
    out = []
    for use in uses:
        limits = policy.scopes.get(use.name)
        if limits is None:
            continue
        out.append(
            {
                "name": use.name,
                "hourly": {
                    "used": use.hourly_count,
                    "limit": limits.calls_per_hour,
                    "next_free_at": iso(use.hourly_next_free_ms),
                },
                "daily": {"spent_usd": _usd(use.daily_cost_micro),
                          "ceiling_usd": limits.daily_estimated_usd},
                "in_flight": {
                    "open": use.in_flight,
                    "limit": limits.in_flight,
                    "next_free_at": iso(use.in_flight_next_free_ms),
                },
                "full": _full(use, limits),
            }
        )
    return out
