"""The status document in the Prometheus text exposition format (`ledger status --prometheus`,
`GET /metrics`): its numeric part as `ledger_` gauges. Pure: the document in, text out.

Labels come from fixed sets only (model keys, pool names, reason codes, scope names from the
policy), never configuration values or provider text (R-DIAG-3).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ledger.catalog import split_model_key


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


_HEALTH_STATES = ("healthy", "failing", "cooling", "probing")


def _health_families(out: _Exposition, rows: list[dict[str, Any]]) -> None:
    """R-DIAG-6: per provider and per model, labelled by scope and target."""

    def each(value: str) -> list[tuple[dict[str, object], float]]:
        return [({"scope": h["scope"], "target": h["target"]}, h[value]) for h in rows]

    def seconds(value: str) -> list[tuple[dict[str, object], float]]:
        return [
            ({"scope": h["scope"], "target": h["target"]}, _epoch_seconds(h[value]))
            for h in rows
            if h[value] is not None
        ]

    out.family(
        "ledger_health_state",
        "1 for the state each provider and model is in (healthy, failing, cooling, probing), "
        "else 0.",
        [
            ({"scope": h["scope"], "target": h["target"], "state": state}, int(h["state"] == state))
            for h in rows
            for state in _HEALTH_STATES
        ],
    )
    out.family(
        "ledger_health_consecutive_failures",
        "Failed attempts in a row since the last success.",
        each("consecutive_failures"),
    )
    out.family(
        "ledger_health_attempts_1h", "Attempts created in the last hour.", each("attempts_1h")
    )
    out.family(
        "ledger_health_failures_1h",
        "Attempts created in the last hour that failed.",
        each("failures_1h"),
    )
    out.family(
        "ledger_health_probe_streak",
        "Consecutive failed recovery probes (each doubles the next cooldown).",
        each("probe_streak"),
    )
    out.family(
        "ledger_health_last_success_timestamp_seconds",
        "When the last attempt succeeded (Unix time).",
        seconds("last_success_at"),
    )
    out.family(
        "ledger_health_last_failure_timestamp_seconds",
        "When the last attempt failed (Unix time), labelled with its kind.",
        [
            (
                {"scope": h["scope"], "target": h["target"], "kind": h["last_failure_kind"]},
                _epoch_seconds(h["last_failure_at"]),
            )
            for h in rows
            if h["last_failure_at"] is not None
        ],
    )


def _scope_families(out: _Exposition, scopes: list[dict[str, Any]]) -> None:
    """R-SC-2: each scope's use and limits, labelled `scope` (names come from the policy)."""

    def each(part: str, key: str) -> list[tuple[dict[str, object], float]]:
        return [
            ({"scope": s["name"]}, s[part][key]) for s in scopes if s[part][key] is not None
        ]

    out.family("ledger_scope_hourly_calls_used", "A scope's reservations in the last hour.",
               each("hourly", "used"))
    out.family("ledger_scope_hourly_calls_limit", "A scope's callsPerHour (absent when unset).",
               each("hourly", "limit"))
    out.family("ledger_scope_daily_estimated_spend_usd",
               "A scope's estimated cost over the rolling 24 h.", each("daily", "spent_usd"))
    out.family("ledger_scope_daily_ceiling_usd",
               "A scope's dailyEstimatedUsd (absent when unset).", each("daily", "ceiling_usd"))
    out.family("ledger_scope_in_flight", "A scope's reservations open now.",
               each("in_flight", "open"))
    out.family("ledger_scope_in_flight_limit", "A scope's inFlight (absent when unset).",
               each("in_flight", "limit"))
    out.family("ledger_scope_full",
               "1 when a scope is at a limit it sets (hourly, daily, in_flight), else 0.",
               [({"scope": s["name"], "limit": part}, int(part in s.get("full", ())))
                for s in scopes for part, key in _SCOPE_LIMITS if s[part][key] is not None])


def _token_families(out: _Exposition, windows: list[dict[str, Any]]) -> None:
    """R-TOK-5: each configured token window's use and limit, labelled by its target (a provider,
    model key or glob from the policy, or `scope:NAME`), kind and window (policy key names)."""

    def labels(w: dict[str, Any]) -> dict[str, object]:
        target = w["target"] if w["scope"] is None else f"scope:{w['scope']}"
        return {"target": target, "kind": w["kind"], "window": w["window"]}

    out.family("ledger_token_budget_used",
               "Tokens a token window counts now (usage where settled, else the estimate).",
               [(labels(w), w["used"]) for w in windows])
    out.family("ledger_token_budget_limit", "A token window's limit (tokenBudgets, scopes).",
               [(labels(w), w["limit"]) for w in windows])


def _learned_families(out: _Exposition, readings: list[dict[str, Any]]) -> None:
    """R-TOK-4: what is left of each live learned limit, labelled by catalog model key and kind
    (`tokens`, `input_tokens`, `output_tokens`)."""
    out.family("ledger_learned_tokens_left",
               "Tokens left of a provider's reported limit for the next reservation (the "
               "reported remaining less the estimates granted since it was read).",
               [({"model": x["model"], "kind": x["kind"]}, max(0, x["left"])) for x in readings])


_SCOPE_LIMITS = (("hourly", "limit"), ("daily", "ceiling_usd"), ("in_flight", "limit"))


def _refusal_families(out: _Exposition, refusals: dict[str, Any]) -> None:
    """R-DIAG-1: the last hour's refusals; labels are reason codes (a fixed set), policy scopes
    and ledger key names (bounded by the operator), '' when none."""
    out.family(
        "ledger_refusals_1h",
        "Requests a service refused in the last hour, by reason, scope and gateway key.",
        [({"reason": r["reason"], "scope": r["scope"] or "", "key": r["key"] or ""}, r["count"])
         for r in refusals["by"]],
    )  # fmt: skip


def _epoch_seconds(value: str) -> float:
    """An ISO 8601 UTC time from the document as Unix seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


UP_HELP = "1 when the ledger was read; 0 when it could not be (the error is on stderr)."
WARNINGS_HELP = "Active status warnings (the warnings list of `ledger status`); alert when > 0."


def render_prometheus_down() -> str:
    """What `status --prometheus` prints when the ledger cannot be read: `ledger_up 0`, so a
    textfile exporter's alert fires instead of the last numbers staying, or zeros, for ever."""
    out = _Exposition()
    out.family("ledger_up", UP_HELP, [({}, 0)])
    return out.text()


def _pool_families(out: _Exposition, views: list[dict[str, Any]]) -> None:
    """Pools (R-RT-7): the cursor, each candidate's eligibility, the live sticky leases. Labels
    are pool names and model keys from the policy (a fixed set)."""
    out.family(
        "ledger_pool_cursor",
        "Index of the candidate a round-robin pool granted last (-1: none yet).",
        [({"pool": p["pool"], "strategy": p["strategy"]},
          -1 if p["cursor"] is None else p["cursor"]) for p in views],
    )  # fmt: skip
    out.family(
        "ledger_pool_candidate_eligible",
        "1 when a pool candidate is eligible now, else 0 (the reason is a label).",
        [
            ({"pool": p["pool"], "model": c["model"], "state": c["state"]},
             int(c["state"] == "eligible"))
            for p in views
            for c in p["candidates"]
        ],
    )  # fmt: skip
    out.family(
        "ledger_pool_sticky_leases",
        "Live sticky leases per pool.",
        [({"pool": p["pool"]}, len(p["leases"])) for p in views],
    )


def render_prometheus(doc: dict[str, Any]) -> str:
    """The numeric part of the document in the Prometheus text format (gauges, `ledger_` prefix)."""
    out = _Exposition()
    out.family("ledger_up", UP_HELP, [({}, 1)])
    out.family("ledger_status_warnings", WARNINGS_HELP, [({}, len(doc["warnings"]))])
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
        "Tokens reported in the last 24 h, by direction (input: uncached prompt tokens).",
        [
            ({"direction": "input"}, d["input_tokens"]),
            ({"direction": "output"}, d["output_tokens"]),
            ({"direction": "cache_write"}, d["cache_write_tokens"]),
            ({"direction": "cache_read"}, d["cache_read_tokens"]),
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
    _health_families(out, doc["health"])
    _pool_families(out, doc.get("pools") or [])
    _scope_families(out, doc.get("scopes") or [])
    _token_families(out, doc.get("token_budgets") or [])
    _learned_families(out, doc.get("learned_limits") or [])
    _refusal_families(out, doc.get("refusals") or {"by": []})
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
        "1 when a process still writes under another policy (R-HOME-3; issue 33: recent stamps).",
        [({}, int(any(w["live"] for w in writers)))],
    )
    st = doc["store"]
    out.family(
        "ledger_store_info",
        "Store facts as labels (value is always 1).",
        [
            (
                {
                    "sqlite_library": st.get("sqlite_library") or "",
                    "sqlite_version": st["sqlite_version"] or "",
                    "journal_mode": st["journal_mode"] or "",
                    "revision": st["revision"] or "",
                },
                1,
            )
        ],
    )
    return out.text()
