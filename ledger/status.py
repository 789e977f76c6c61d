"""The status document (R-DIAG-1, R-DIAG-2): one read of the ledger, rendered as JSON, text or
Prometheus exposition.

Invariant: the document holds only ledger facts (model keys, source ids, reason codes, counts,
times, money) and never configuration values, credentials, provider error bodies or model text
(R-DIAG-3). `status_document` and the renderers are pure; `build_status` is the only I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.api import Ledger
from ledger.catalog import split_model_key
from ledger.clock import iso
from ledger.config import Policy
from ledger.durations import format_duration_ms
from ledger.records import micro_to_usd
from ledger.store.engine import network_filesystem
from ledger.store.status_views import StatusData, status_data

WIDTH = 100
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RouteView:
    """The routes a fresh source would get (R-SEL-2..6), and every exclusion with its reason."""

    routes: tuple[str, ...]
    excluded: tuple[tuple[str, str, int | None], ...]  # model, reason, cooling until
    retry_at_ms: int | None = None


def build_status(ledger: Ledger) -> dict[str, Any]:
    """Read the ledger once (one read transaction) and build the whole status document."""
    data = status_data(ledger.db, ledger.policy.calls_per_hour)
    path = ledger.state.db_path
    fs = network_filesystem(path) if path is not None else None
    return status_document(data, ledger.policy, ledger.fingerprint, fresh_routes(ledger), fs)


def fresh_routes(ledger: Ledger) -> RouteView:
    """The selector's answer for a fresh source with no failure and nothing tried."""
    selection = ledger.select(None)
    return RouteView(
        routes=selection.routes,
        excluded=tuple((e.model, str(e.reason), e.until_ms) for e in selection.excluded),
        retry_at_ms=selection.retry_at_ms,
    )


def _usd(micro: int) -> float:
    value = micro_to_usd(micro)
    return 0.0 if value is None else value


def status_document(
    data: StatusData,
    policy: Policy,
    fingerprint: str,
    routes: RouteView,
    network_fs: str | None,
) -> dict[str, Any]:
    """The stable JSON shape of `ledger status --json` (documented in the README)."""
    now = data.now_ms
    ceiling = policy.daily_estimated_usd
    ordered = sorted(data.writers, key=lambda w: (-w.last_seen_ms, w.fingerprint))
    writers: list[dict[str, Any]] = [
        {
            "fingerprint": w.fingerprint,
            "last_seen": iso(w.last_seen_ms),
            "reservations": w.reservations,
            "current": w.fingerprint == fingerprint,
        }
        for w in ordered
    ]
    stale = [w.fingerprint for w in ordered if w.fingerprint != fingerprint]
    policy_warning = (
        f"reservations in the last 24 h were written under another policy ({', '.join(stale)}); "
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
        "excluded": [{"model": m, "reason": r, "until": iso(u)} for m, r, u in routes.excluded],
        "routes_retry_at": iso(routes.retry_at_ms),
        "cooldowns": [
            c.to_json(now)
            for c in data.cooldowns
        ],
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
        },
        "history": [
            {
                "day": d.day,
                "attempts": d.attempts,
                "succeeded": d.succeeded,
                "failed": d.failed,
                "input_tokens": d.input_tokens,
                "output_tokens": d.output_tokens,
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
            "sqlite_version": data.sqlite_version,
            "journal_mode": data.journal_mode,
            "journal_mode_chosen": data.journal_mode_chosen,
            "revision": data.revision,
            "network_filesystem": fs_warning,
        },
        "policy": {"fingerprint": fingerprint, "writers": writers, "warning": policy_warning},
        "warnings": [w for w in (policy_warning, fs_warning) if w],
    }


# --------------------------------------------------------------------------- text dashboard


def _cut(value: object, width: int) -> str:
    """Text of at most `width` characters (an ellipsis marks a cut)."""
    text = "-" if value is None else str(value)
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _left(ms: float) -> str:
    """Whole seconds left, compact (`1h30m`, `45s`)."""
    return format_duration_ms(max(0, math.ceil(ms / 1000)) * 1000)


def _time(value: str | None) -> str:
    """`2027-01-15T08:00:00.000Z` shown as `01-15 08:00:00`."""
    return "-" if value is None else f"{value[5:10]} {value[11:19]}"


def _money(value: float | None) -> str:
    return "none" if value is None else f"${value:,.4f}"


def _heading(title: str) -> str:
    return f"── {title} " + "─" * max(0, WIDTH - len(title) - 4)


def _table(widths: Sequence[int], rows: Iterable[Sequence[object]], indent: int = 2) -> list[str]:
    """Rows as aligned columns (negative width = right-aligned), each line cut to WIDTH."""
    lines = []
    for row in rows:
        cells = []
        for w, value in zip(widths, row, strict=True):
            text = _cut(value, abs(w))
            cells.append(text.rjust(-w) if w < 0 else text.ljust(w))
        lines.append(_cut((" " * indent + "  ".join(cells)).rstrip(), WIDTH))
    return lines


def render_text(doc: dict[str, Any]) -> str:
    """A dashboard for a 100-column terminal: sections with aligned columns, no dumps."""
    lines: list[str] = []
    pol = doc["policy"]
    lines.append(_cut(f"ledger status at {doc['now']}   policy {pol['fingerprint']}", WIDTH))
    for warning in doc["warnings"]:
        lines.append(_cut(f"WARNING: {warning}", WIDTH))
    lines += _routes_lines(doc)
    lines += _budget_lines(doc)
    lines += _cooldown_lines(doc)
    lines += _source_lines(doc)
    lines += _recent_lines(doc)
    if doc["notices"]:
        lines.append(_heading("notices"))
        lines += _table(
            (14, 9, -5, 66),
            [
                (_time(n["last"]), n["category"], f"x{n['count']}", n["message"])
                for n in doc["notices"]
            ],
        )
    lines += _store_lines(doc)
    return "\n".join(lines)


def _routes_lines(doc: dict[str, Any]) -> list[str]:
    lines = [_heading("routes")]
    lines.append(_cut(f"  default model  {doc['default_model'] or '(none set)'}", WIDTH))
    if doc["routes"]:
        lines.append(_cut("  fresh source   " + " → ".join(doc["routes"]), WIDTH))
    else:
        nxt = doc["routes_retry_at"]
        lines.append(
            "  fresh source   no eligible route" + (f"; the first frees at {nxt}" if nxt else "")
        )
    shown = doc["excluded"][:12]
    lines += _table(
        (13, 44, 36),
        [
            (
                "excluded" if i == 0 else "",
                e["model"],
                e["reason"] + (f" until {_time(e['until'])}" if e["until"] else ""),
            )
            for i, e in enumerate(shown)
        ],
    )
    if len(doc["excluded"]) > len(shown):
        lines.append(f"  {'':13}  … and {len(doc['excluded']) - len(shown)} more (see --json)")
    return lines


def _budget_lines(doc: dict[str, Any]) -> list[str]:
    h, d = doc["hourly"], doc["daily"]
    nxt = "a slot is free now" if h["next_free_at"] is None else f"next slot {h['next_free_at']}"
    ceiling = "no ceiling" if d["ceiling_usd"] is None else f"ceiling {_money(d['ceiling_usd'])}"
    lines = [
        _heading("budgets"),
        _cut(f"  hourly calls   {h['used']} / {h['limit']} used in the last hour; {nxt}", WIDTH),
        _cut(
            f"  daily cost     {_money(d['spent_usd'])} estimated in 24 h; {ceiling}; "
            f"{d['unknown_cost_attempts']} attempt(s) of unknown cost",
            WIDTH,
        ),
        _cut(
            f"  tokens (24 h)  in {d['input_tokens']:,}  out {d['output_tokens']:,}  "
            f"over {d['attempts']} attempt(s)",
            WIDTH,
        ),
    ]
    if doc["history"]:
        lines.append("  compacted history (per day)")
        lines += _table(
            (10, -9, -9, -7, -14, -14, -12, -8),
            [("day", "attempts", "ok", "failed", "input tok", "output tok", "spent", "unknown")]
            + [
                (
                    x["day"],
                    x["attempts"],
                    x["succeeded"],
                    x["failed"],
                    f"{x['input_tokens']:,}",
                    f"{x['output_tokens']:,}",
                    _money(x["spent_usd"]),
                    x["unknown_cost_attempts"],
                )
                for x in doc["history"][:7]
            ],
            indent=4,
        )
    return lines


def _cooldown_lines(doc: dict[str, Any]) -> list[str]:
    lines = [_heading("cooldowns")]
    if not doc["cooldowns"]:
        return [*lines, "  none active"]
    return lines + _table(
        (8, 44, -9, 16, 7),
        [("scope", "target", "left", "kind", "origin")]
        + [
            (c["scope"], c["target"], _left(c["remaining_s"] * 1000), c["kind"], c["origin"])
            for c in doc["cooldowns"]
        ],
    )


def _source_lines(doc: dict[str, Any]) -> list[str]:
    src = doc["sources"]
    counts = "  ".join(f"{state} {n}" for state, n in src["counts"].items())
    lines = [_heading("sources"), f"  {counts}"]
    if not src["list"]:
        return lines
    lines += _table(
        (26, 6, -5, -6, -6, -4, -7, 26),
        [("source", "state", "calls", "models", "outerr", "fail", "time", "paused / retry")]
        + [
            (
                s["id"],
                s["state"],
                s["calls"],
                len(s["models"]),
                s["output_failures"],
                s["failures"],
                _left(s["time_used_ms"]),
                s["pause_reason"] or (f"retry {_time(s['retry_at'])}" if s["retry_at"] else ""),
            )
            for s in src["list"]
        ],
    )
    shown, total = len(src["list"]), sum(src["counts"].values())
    if total > shown:
        lines.append(f"  ({shown} of {total} shown: leased, paused and queued first)")
    return lines


def _recent_lines(doc: dict[str, Any]) -> list[str]:
    lines = [_heading("recent attempts")]
    if not doc["recent"]:
        return [*lines, "  none"]
    rows: list[Sequence[object]] = [("time", "source", "model", "role", "outcome", "took")]
    for a in doc["recent"]:
        outcome = a["status"] if not a["kind"] else f"{a['kind']}/{a['subkind'] or '-'}"
        if a["late"]:
            outcome += " LATE"
        took = "-" if a["duration_ms"] is None else f"{a['duration_ms'] / 1000:.1f}s"
        rows.append((_time(a["time"]), a["source"], a["model"], a["role"], outcome, took))
    return lines + _table((14, 14, 20, 10, 24, -6), rows)


def _store_lines(doc: dict[str, Any]) -> list[str]:
    st = doc["store"]
    mode = st["journal_mode"] or "n/a"
    chosen = st["journal_mode_chosen"]
    if chosen and chosen != mode:
        mode += f" (chosen {chosen})"
    writers = ", ".join(
        f"{w['fingerprint']}{'' if w['current'] else ' (other)'} last {_time(w['last_seen'])}"
        for w in doc["policy"]["writers"][:3]
    )
    return [
        _heading("store"),
        _cut(
            f"  SQLite {st['sqlite_version'] or 'n/a'}   journal {mode}   "
            f"revision {st['revision'] or 'none'}"
            if st["backend"] == "sqlite"
            else f"  {st['backend']}   revision {st['revision'] or 'none'}",
            WIDTH,
        ),
        _cut(f"  policy writers (24 h)  {writers or 'none'}", WIDTH),
    ]


# --------------------------------------------------------------------------- Prometheus


def _label(value: object) -> str:
    """A label value escaped per the text exposition format."""
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class _Exposition:
    """Collects metric families; each family gets exactly one HELP and TYPE line."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, help_text: str, samples: Iterable[tuple[dict[str, object], float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(
                f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}"
            )

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _provider_of(target: str) -> str:
    return split_model_key(target)[0] if "/" in target else target


def render_prometheus(doc: dict[str, Any]) -> str:
    """The numeric part of the document in the Prometheus text format (gauges, `ledger_` prefix)."""
    out = _Exposition()
    h, d = doc["hourly"], doc["daily"]
    out.family(
        "ledger_hourly_calls_used", "Reservations created in the last hour.", [({}, h["used"])]
    )
    out.family(
        "ledger_hourly_calls_limit",
        "The shared hourly call budget (callsPerHour).",
        [({}, h["limit"])],
    )
    out.family(
        "ledger_daily_estimated_spend_usd",
        "Estimated cost over the rolling 24 h (actual where known, else estimate).",
        [({}, d["spent_usd"])],
    )
    out.family(
        "ledger_daily_ceiling_usd",
        "The daily estimated cost ceiling (absent when unset).",
        [({}, d["ceiling_usd"])] if d["ceiling_usd"] is not None else [],
    )
    out.family(
        "ledger_unknown_cost_attempts",
        "Attempts in the last 24 h whose cost is unknown (not in the spend).",
        [({}, d["unknown_cost_attempts"])],
    )
    out.family(
        "ledger_daily_tokens",
        "Tokens reported in the last 24 h, by direction.",
        [
            ({"direction": "input"}, d["input_tokens"]),
            ({"direction": "output"}, d["output_tokens"]),
        ],
    )
    out.family(
        "ledger_cooldown_remaining_seconds",
        "Seconds left on each active cooldown.",
        [
            (
                {
                    "scope": c["scope"],
                    "target": c["target"],
                    "provider": _provider_of(c["target"]),
                    "kind": c["kind"],
                    "origin": c["origin"],
                },
                c["remaining_s"],
            )
            for c in doc["cooldowns"]
        ],
    )
    out.family(
        "ledger_sources",
        "Sources by queue state.",
        [({"state": state}, n) for state, n in doc["sources"]["counts"].items()],
    )
    out.family(
        "ledger_attempts_24h",
        "Attempts in the last 24 h by model, status and kind.",
        [
            (
                {
                    "provider": o["provider"],
                    "model": o["model"],
                    "status": o["status"],
                    "kind": o["kind"] or "none",
                },
                o["count"],
            )
            for o in doc["outcomes_24h"]
        ],
    )
    out.family(
        "ledger_routes_eligible", "Routes a fresh source could use now.", [({}, len(doc["routes"]))]
    )
    writers = doc["policy"]["writers"]
    out.family(
        "ledger_policy_writers",
        "Distinct policy fingerprints on reservations in the last 24 h.",
        [({}, len(writers))],
    )
    out.family(
        "ledger_policy_mismatch",
        "1 when a reservation in the last 24 h was written under another policy (R-HOME-3).",
        [({}, int(any(not w["current"] for w in writers)))],
    )
    st = doc["store"]
    out.family(
        "ledger_store_info",
        "Store facts as labels (value is always 1).",
        [
            (
                {
                    "sqlite_version": st["sqlite_version"] or "",
                    "journal_mode": st["journal_mode"] or "",
                    "revision": st["revision"] or "",
                },
                1,
            )
        ],
    )
    return out.text()
