"""The `ledger status` text dashboard: the status document laid out for a terminal of any width
from 80 columns up.

Invariant: no line is longer than the width unless a single word is; times, kinds and reason codes
are never cut — a table drops its least useful columns first, then narrows the columns that hold
ids and model keys (which alone may be cut, with `…`), and prose wraps at spaces. Pure: the
document in, text out.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.clock import human_duration_ms

WIDTH = 100
MIN_WIDTH = 80
LABEL = 17  # "  default model  " — where the value of a labelled line starts


@dataclass(frozen=True)
class Column:
    """A table column: `cut` columns (ids, keys) share what is left and may be cut; the others
    are as wide as their widest cell; `drop` > 0 columns go first (highest first) when narrow."""

    header: str
    right: bool = False
    cut: bool = False
    drop: int = 0
    min_width: int = 10


def cut(text: str, width: int) -> str:
    """Text of at most `width` characters (an ellipsis marks a cut)."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _wrap(text: str, width: int, indent: int = LABEL) -> list[str]:
    """Prose wrapped at spaces; continuation lines start under the value of a labelled line."""
    return textwrap.wrap(
        text,
        width,
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
        drop_whitespace=True,
    ) or [""]


def table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[object]],
    width: int,
    indent: int = 2,
    header: bool = True,
) -> list[str]:
    """Aligned rows that fit `width`: drop optional columns, then narrow the `cut` columns."""
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    head = [c.header for c in columns]
    shown = list(range(len(columns)))
    while True:
        widths = {i: max(len(r[i]) for r in [head, *cells]) for i in shown}
        narrow = [i for i in shown if columns[i].cut]
        spare = width - indent - 2 * (len(shown) - 1)
        spare -= sum(widths[i] for i in shown if i not in narrow)
        droppable = [i for i in shown if columns[i].drop > 0]
        if sum(min(widths[i], columns[i].min_width) for i in narrow) <= spare or not droppable:
            break
        shown.remove(max(droppable, key=lambda i: columns[i].drop))
    # share the spare width among the cut columns, narrowest first (they keep their own width)
    for n, i in enumerate(sorted(narrow, key=lambda i: widths[i])):
        widths[i] = min(widths[i], max(columns[i].min_width, spare // (len(narrow) - n)))
        spare -= widths[i]
    lines = []
    for row in [head, *cells] if header else cells:
        parts = []
        for i in shown:
            text = cut(row[i], widths[i]) if columns[i].cut else row[i]
            parts.append(text.rjust(widths[i]) if columns[i].right else text.ljust(widths[i]))
        lines.append((" " * indent + "  ".join(parts)).rstrip())
    return lines


def short_time(value: str | None) -> str:
    """`2027-01-15T08:00:00.000Z` shown as `01-15 08:00:00`."""
    return "-" if value is None else f"{value[5:10]} {value[11:19]}"


def _left(seconds: float) -> str:
    """Time left as an operator reads it (`1h59m`, `45s`), never more than is left."""
    return human_duration_ms(max(0, math.floor(seconds * 1000)))


def took(ms: int | None) -> str:
    """A duration as measured, in the one duration format of the CLI, the page and `simulate`
    (`human_duration_ms`: `25ms`, `1s`, `2m5s`), never rounded up."""
    return "-" if ms is None else human_duration_ms(ms)


def _money(value: float | None) -> str:
    return "none" if value is None else f"${value:,.4f}"


def _heading(title: str, width: int) -> str:
    return f"── {title} " + "─" * max(0, width - len(title) - 4)


def render_text(doc: dict[str, Any], width: int = WIDTH) -> str:
    """The dashboard for a terminal `width` columns wide (at least 80 are used)."""
    width = max(MIN_WIDTH, width)
    pol = doc["policy"]
    lines = _wrap(f"ledger status at {doc['now']}   policy {pol['fingerprint']}", width, 2)
    for warning in doc["warnings"]:
        lines += _wrap(f"WARNING: {warning}", width, 9)
    lines += _routes_lines(doc, width)
    lines += _budget_lines(doc, width)
    lines += _refusal_lines(doc, width)
    lines += _cooldown_lines(doc, width)
    lines += _pool_lines(doc, width)
    lines += _health_lines(doc, width)
    lines += _failover_lines(doc, width)
    lines += _source_lines(doc, width)
    lines += _recent_lines(doc, width)
    if doc["notices"]:
        lines.append(_heading("notices", width))
        lines += _notice_lines(doc, width)
    lines += _store_lines(doc, width)
    return "\n".join(lines)


def _routes_lines(doc: dict[str, Any], width: int) -> list[str]:
    lines = [_heading("routes", width)]
    lines += _wrap(f"  default model  {doc['default_model'] or '(none set)'}", width)
    if doc["routes"]:
        lines += _wrap("  fresh source   " + " → ".join(doc["routes"]), width)
    else:
        nxt = doc["routes_retry_at"]
        lines += _wrap(
            "  fresh source   no eligible route" + (f"; the first frees at {nxt}" if nxt else ""),
            width,
        )
    excluded = doc["excluded"]
    elsewhere = bool(doc.get("service_elsewhere"))
    if len(excluded) <= EXCLUDED_LISTED:  # a small catalog: each model with its reason
        lines += table(
            (Column(""), Column("model", cut=True, min_width=16), Column("reason")),
            [
                ("" if i else "excluded", e["model"], _reason(e, elsewhere))
                for i, e in enumerate(excluded)
            ],
            width,
            header=False,
        )
        return lines
    # a large catalog: a count per reason, as `ledger select` shows (`--json` lists each model);
    # the note (credential variables, first cooldown end) is prose and wraps under itself
    counts = doc["excluded_by_reason"]
    reason_w = max(len(r) for r in counts)
    count_w = max(len(f"{n:,}") for n in counts.values())
    for i, (reason, count) in enumerate(counts.items()):
        head = f"  {'' if i else 'excluded':8}  {reason:<{reason_w}}  {count:>{count_w},}  "
        lines += _wrap(head + _reason_note(reason, excluded, elsewhere), width, len(head))
    lines.append(f"  {'':8}  {len(excluded):,} models excluded in all (--json lists each)")
    return lines


EXCLUDED_LISTED = 12
"""Up to this many excluded models are listed one by one; more are counted per reason."""


ELSEWHERE = "the running service reads its own environment"
"""Said of a credential variable this shell lacks while `ledger serve` runs on its state dir."""


def missing_pieces(e: dict[str, Any], elsewhere: bool = False) -> str:
    """What makes an unavailable model available: ` (set VAR and a baseUrl)` (the provider's
    baseUrl in catalog.json), ` (set VAR)`, or empty; every missing piece is named (issue 33).
    `elsewhere` (a service runs on the state directory): the variable is missing *in this
    shell*, ` (VAR is not set in this shell; the running service reads its own environment)`."""
    variable = e.get("credential_env")
    if elsewhere and variable:
        more = "; it also needs a baseUrl" if e.get("base_url_missing") else ""
        return f" ({variable} is not set in this shell; {ELSEWHERE}{more})"
    pieces = [f"set {variable}"] if variable else []
    if e.get("base_url_missing"):
        pieces.append("a baseUrl")
    return f" ({' and '.join(pieces)})" if pieces else ""


def _reason(e: dict[str, Any], elsewhere: bool = False) -> str:
    """An exclusion's reason with when a cooldown ends or which pieces are missing."""
    text = str(e["reason"]) + (f" until {short_time(e['until'])}" if e.get("until") else "")
    return text + missing_pieces(e, elsewhere)


def _reason_note(reason: str, excluded: Sequence[dict[str, Any]], elsewhere: bool) -> str:
    """For a reason's count: the credential variables to set, or when the first cooldown ends."""
    of_reason = [e for e in excluded if e["reason"] == reason]
    ends = [e["until"] for e in of_reason if e.get("until")]
    if ends:
        return f"first frees {short_time(min(ends))}"
    hint = credential_hint(e.get("credential_env") for e in of_reason)
    if hint and elsewhere:
        hint = f"not set in this shell: {hint.removeprefix('set ')} ({ELSEWHERE})"
    no_url = sum(1 for e in of_reason if e.get("base_url_missing"))
    if no_url:
        hint += ("; " if hint else "") + f"{no_url} also need a baseUrl in catalog.json"
    return hint


def credential_hint(names: Iterable[str | None], shown: int = 3) -> str:
    """`set A, B, C (+N more variables)`: the credential variables (names, never values) that
    would make the most unavailable models available, most useful first; empty if none."""
    counts = Counter(n for n in names if n)
    if not counts:
        return ""
    ranked = sorted(counts, key=lambda n: (-counts[n], n))
    more = len(ranked) - shown
    return "set " + ", ".join(ranked[:shown]) + (f" (+{more} more variables)" if more > 0 else "")


def _scope_lines(scopes: list[dict[str, Any]]) -> list[str]:
    """One line per scope (R-SC-2): each limit it sets, its use, and when a full one frees."""
    lines = []
    for s in scopes:
        h, d, f = s["hourly"], s["daily"], s["in_flight"]
        parts = []
        if h["limit"] is not None:
            parts.append(f"calls {h['used']} / {h['limit']} this hour"
                         + (f" (next slot {h['next_free_at']})" if h["next_free_at"] else ""))
        else:
            parts.append(f"calls {h['used']} this hour")
        cost = _money(d["spent_usd"])
        parts.append(f"cost {cost} / {_money(d['ceiling_usd'])} in 24 h"
                     if d["ceiling_usd"] is not None else f"cost {cost} in 24 h")
        if f["limit"] is not None:
            parts.append(f"open {f['open']} / {f['limit']}"
                         + (f" (a slot frees by {f['next_free_at']})" if f["next_free_at"] else ""))
        else:
            parts.append(f"open {f['open']}")
        full = s.get("full") or []
        mark = f" FULL ({', '.join(full)})" if full else ""  # R-DIAG-1: its next call is refused
        lines.append(f"  scope {s['name']}{mark}: " + "; ".join(parts))
    return lines


def _token_lines(windows: list[dict[str, Any]]) -> list[str]:
    """R-TOK-5: one line per configured token window: its use against its limit and when its
    first counted part leaves."""
    lines = []
    for w in windows:
        on = f"scope {w['scope']}" if w["scope"] is not None else f"{w['kind']} {w['target']}"
        full = " FULL" if w["used"] >= w["limit"] else ""
        frees = f" (frees from {w['frees_at']})" if w["frees_at"] else ""
        lines.append(f"  tokens {on}{full}: {w['window']} {w['used']:,} / {w['limit']:,}{frees}")
    return lines


def _learned_lines(readings: list[dict[str, Any]]) -> list[str]:
    """R-TOK-4: one line per live reading of a provider's token limit: what is left for the next
    reservation, what the provider reported (of its limit) and when it resets."""
    lines = []
    for x in readings:
        full = " FULL" if x["left"] <= 0 else ""
        of = "" if x["limit"] is None else f" of {x['limit']:,}"
        left = max(0, x["left"])
        lines.append(f"  learned {x['model']} {x['kind']}{full}: {left:,} left (reported "
                     f"{x['remaining']:,}{of} at {x['read_at']}); resets {x['resets_at']}")
    return lines


def _refusal_lines(doc: dict[str, Any], width: int) -> list[str]:
    """R-DIAG-1: the last hour's refusals by reason, the scope that refused and the key that
    asked, the most frequent first; nothing when there were none."""
    refusals = doc.get("refusals") or {"by": []}
    if not refusals["by"]:
        return []
    lines = [_heading(f"refusals (last hour: {refusals['total']:,})", width)]
    return lines + table(
        (
            Column("reason"),
            Column("scope", cut=True, min_width=8),
            Column("key", cut=True, min_width=8),
            Column("count", right=True),
            Column("last", drop=1),
        ),
        [
            (r["reason"], r["scope"] or "-", r["key"] or "-", f"{r['count']:,}",
             short_time(r["last_minute"]))
            for r in refusals["by"][:REFUSALS_LISTED]
        ],
        width,
    ) + ([f"  ({len(refusals['by']) - REFUSALS_LISTED} more in --json)"]
         if len(refusals["by"]) > REFUSALS_LISTED else [])  # fmt: skip


REFUSALS_LISTED = 10


def _budget_lines(doc: dict[str, Any], width: int) -> list[str]:
    h, d = doc["hourly"], doc["daily"]
    nxt = "a slot is free now" if h["next_free_at"] is None else f"next slot {h['next_free_at']}"
    ceiling = "no ceiling" if d["ceiling_usd"] is None else f"ceiling {_money(d['ceiling_usd'])}"
    lines = [_heading("budgets", width)]
    for text in (
        f"  hourly calls   {h['used']} / {h['limit']} used in the last hour; {nxt}",
        *_per_hour(doc.get("hours_24") or []),
        f"  daily cost     {_money(d['spent_usd'])} estimated in 24 h; {ceiling}; "
        f"{d['unknown_cost_attempts']} attempt(s) of unknown cost",
        f"  tokens (24 h)  in {d['input_tokens']:,}  out {d['output_tokens']:,}  "
        f"cache write {d['cache_write_tokens']:,}  cache read {d['cache_read_tokens']:,}  "
        f"over {d['attempts']} attempt(s)",
        *_scope_lines(doc.get("scopes") or []),
        *_token_lines(doc.get("token_budgets") or []),
        *_learned_lines(doc.get("learned_limits") or []),
    ):
        lines += _wrap(text, width)
    if doc["history"]:
        lines.append("  compacted history (per day)")
        lines += table(
            [Column("day")]
            + [
                Column(h, right=True)
                for h in (
                    "attempts",
                    "ok",
                    "failed",
                    "input tok",
                    "output tok",
                    "cache wr",
                    "cache rd",
                    "spent",
                    "unknown",
                )
            ],
            [
                (
                    x["day"],
                    x["attempts"],
                    x["succeeded"],
                    x["failed"],
                    f"{x['input_tokens']:,}",
                    f"{x['output_tokens']:,}",
                    f"{x['cache_write_tokens']:,}",
                    f"{x['cache_read_tokens']:,}",
                    _money(x["spent_usd"]),
                    x["unknown_cost_attempts"],
                )
                for x in doc["history"][:7]
            ],
            width,
            indent=4,
        )
    return lines


SPARKS = " ▁▂▃▄▅▆▇█"


def _per_hour(hours: list[dict[str, Any]]) -> list[str]:
    """The last 24 h per hour as one line of bars (oldest left), with the failures' share."""
    if not any(h["attempts"] for h in hours):
        return []
    peak = max(h["attempts"] for h in hours)
    bars = "".join(SPARKS[math.ceil(h["attempts"] / peak * (len(SPARKS) - 1))] for h in hours)
    failed = sum(sum(h["failed"].values()) for h in hours)
    return [f"  calls per hour {bars}  (24 h, now at the right; peak {peak}, {failed} failed)"]


def _failover_lines(doc: dict[str, Any], width: int) -> list[str]:
    failovers = doc.get("failovers") or []
    if not failovers:
        return []
    lines = [_heading("failovers (24 h)", width)]
    return lines + table(
        (
            Column("time"),
            Column("source", cut=True, min_width=8),
            Column("from → to", cut=True, min_width=20),
            Column("after"),
            Column("outcome", drop=1),
        ),
        [
            (
                short_time(f["time"]),
                f["source"],
                f"{f['from'] or '?'} → {f['to']}",
                f["kind"] or "-",
                f["status"],
            )
            for f in failovers[:5]
        ],
        width,
    )


def _cooldown_lines(doc: dict[str, Any], width: int) -> list[str]:
    lines = [_heading("cooldowns", width)]
    if not doc["cooldowns"]:
        return [*lines, "  none active"]
    lines += table(
        (
            Column("scope"),
            Column("target", cut=True, min_width=16),
            Column("left", right=True),
            Column("until"),
            Column("kind"),
            Column("origin"),
        ),
        [
            (c["scope"], c["target"], _left(c["remaining_s"]), short_time(c["until"]), c["kind"],
             c["origin"])
            for c in doc["cooldowns"]
        ],
        width,
    )
    for c in doc["cooldowns"]:  # an operator's note (`cooldown set --reason`), as prose
        if c.get("reason"):
            lines += _wrap(f"  reason  {c['scope']} {c['target']}: {c['reason']}", width, 10)
    return lines


def _pool_lines(doc: dict[str, Any], width: int) -> list[str]:
    """Pools (R-RT-7): strategy, cursor, each candidate's state, live sticky leases."""
    pools = doc.get("pools")
    if not pools:
        return []
    lines = [_heading("pools", width)]
    for p in pools:
        cursor = "-" if p["cursor"] is None else str(p["cursor"])
        lines += _wrap(
            f"  {p['pool']}  {p['strategy']}, sticky {p['sticky']}, cursor {cursor}, "
            f"{len(p['leases'])} sticky leases", width, 4,
        )  # fmt: skip
        for i, c in enumerate(p["candidates"]):
            mark = "*" if p["cursor"] == i else " "
            until = f" until {short_time(c['until'])}" if c["until"] else ""
            lines += _wrap(f"   {mark} {c['model']}  {c['state']}{until}", width, 6)
    return lines


def _health_lines(doc: dict[str, Any], width: int) -> list[str]:
    # a provider's target has no `/`, a model's is its key: no scope column is needed
    lines = [_heading("health", width)]
    if not doc["health"]:
        return [*lines, "  no provider or model seen yet"]
    return lines + table(
        (
            Column("target", cut=True, min_width=16),
            Column("state"),
            Column("fails", right=True),
            Column("last failure"),
            Column("last success", drop=2),
            Column("1h failed", right=True),
            Column("probes", right=True, drop=1),
        ),
        [
            (
                h["target"],
                h["state"],
                h["consecutive_failures"],
                "-"
                if h["last_failure_kind"] is None
                else f"{h['last_failure_kind']} {short_time(h['last_failure_at'])}",
                short_time(h["last_success_at"]),
                f"{h['failures_1h']}/{h['attempts_1h']}",
                h["probe_streak"],
            )
            for h in doc["health"]
        ],
        width,
    )


def _source_lines(doc: dict[str, Any], width: int) -> list[str]:
    src = doc["sources"]
    counts = "  ".join(f"{state} {n}" for state, n in src["counts"].items())
    lines = [_heading("sources", width), f"  {counts}"]
    if not src["list"]:
        return lines
    lines += table(
        (
            Column("source", cut=True, min_width=12),
            Column("state"),
            Column("calls", right=True, drop=1),
            Column("models", right=True, drop=2),
            Column("failures", right=True),
            Column("bad output", right=True),
            Column("time used", right=True, drop=3),
            Column("paused / next retry"),
        ),
        [
            (
                s["id"],
                s["state"],
                s["calls"],
                len(s["models"]),
                s["failures"],
                s["output_failures"],
                took(s["time_used_ms"]) + ("*" if s.get("open_allowance_ms") else ""),
                _next(s),
            )
            for s in src["list"]
        ],
        width,
    )
    if any(s.get("open_allowance_ms") for s in src["list"]):
        lines += _wrap(
            "  * time used counts the whole allowance of open reservations (and of expired ones,"
            " never settled), as the sourceTimeMs budget does",
            width,
            4,
        )
    shown, total = len(src["list"]), sum(src["counts"].values())
    if total > shown:
        lines.append(f"  ({shown} of {total} shown: leased, paused and queued first)")
    return lines


def _next(source: dict[str, Any]) -> str:
    """Why a source waits: its pause reason, or its retry time while it is still queued."""
    if source["state"] == "paused":
        return str(source["pause_reason"] or "paused")
    if source["state"] == "queued" and source["retry_at"]:
        return f"retry {short_time(source['retry_at'])}"
    if source["state"] == "leased" and source["lease_expires"]:
        return f"lease until {short_time(source['lease_expires'])}"
    return ""


def _recent_lines(doc: dict[str, Any], width: int) -> list[str]:
    lines = [_heading("recent attempts", width)]
    if not doc["recent"]:
        return [*lines, "  none"]
    rows: list[Sequence[object]] = []
    for a in doc["recent"]:
        outcome = a["status"] if not a["kind"] else f"{a['kind']}/{a['subkind'] or '-'}"
        if a["late"]:
            outcome += " LATE"
        when = short_time(a["time"])
        rows.append((when, a["source"], a["model"], a["role"], outcome, took(a["duration_ms"])))
    return lines + table(
        (
            Column("time"),
            Column("source", cut=True, min_width=8),
            Column("model", cut=True, min_width=12),
            Column("role", drop=1),
            Column("outcome"),
            Column("took", right=True, drop=2),
        ),
        rows,
        width,
    )


def _notice_lines(doc: dict[str, Any], width: int) -> list[str]:
    lines = []
    for n in doc["notices"]:
        head = f"  {short_time(n['last'])}  {n['category']:<9} {'x' + str(n['count']):>5}  "
        # a notice is per source: without its name two sources failing alike read the same
        whose = f" (source {cut(n['source'], 40)})" if n["source"] else ""
        lines += _wrap(head + n["message"] + whose, width, len(head))
    return lines


def _store_lines(doc: dict[str, Any], width: int) -> list[str]:
    st = doc["store"]
    mode = st["journal_mode"] or "n/a"
    chosen = st["journal_mode_chosen"]
    if chosen and chosen != mode:
        mode += f" (chosen {chosen})"
    writers = ", ".join(
        f"{w['fingerprint']}{'' if w['current'] else ' (other)'} last {short_time(w['last_seen'])}"
        for w in doc["policy"]["writers"][:3]
    )
    return [
        _heading("store", width),
        *_wrap(
            f"  SQLite {st['sqlite_version'] or 'n/a'} ({st.get('sqlite_library') or 'n/a'})"
            f"   journal {mode}   "
            f"revision {st['revision'] or 'none'}"
            if st["backend"] == "sqlite"
            else f"  {st['backend']}   revision {st['revision'] or 'none'}",
            width,
        ),
        *_wrap(f"  policy writers (24 h)  {writers or 'none'}", width, 24),
    ]
