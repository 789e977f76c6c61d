"""The status page (R-SRV-8): one HTML page rendered from the status document — the same dict
`ledger status --json` prints, so the page, the text and the JSON never disagree.

Invariants: pure (the document in, HTML out); Jinja2 with autoescaping, so every value from the
ledger is escaped; no external asset, no inline event handler, no `style` attribute. The CSS and
the script are separate assets (`render_assets`) that a server serves from its own origin under a
strict Content-Security-Policy; the standalone file (`inline=True`) carries them inline with a CSP
meta element that allows exactly those two blocks by their SHA-256 and nothing else (no network).
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import cache
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from ledger.clock import human_duration_ms
from ledger.page.chart import PATTERNS, build_chart

REFRESH_SECONDS = 5
# what the service sends with the page; the standalone file's meta CSP is stricter (no connect)
SERVED_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class Assets:
    """The page's stylesheet and script, as served at `css_url` and `js_url`."""

    css: bytes
    js: bytes


@cache
def render_assets() -> Assets:
    """The page's CSS and JavaScript bytes (served by the service, e.g. /page.css, /page.js)."""
    static = resources.files("ledger.page") / "static"
    return Assets((static / "page.css").read_bytes(), (static / "page.js").read_bytes())


@cache
def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("ledger.page", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["usd"] = usd
    env.filters["left"] = left
    env.filters["axis_usd"] = axis_usd
    return env


def _sha256(data: bytes) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(data).digest()).decode() + "'"


def usd(value: float | None) -> str:
    return "none" if value is None else f"${value:,.4f}"


def axis_usd(value: float) -> str:
    """An axis label in dollars with no trailing zeros (`$0.05`, `$2`, `$0.0002`)."""
    text = format(Decimal(str(value)).normalize(), "f")
    return f"${text}"


def left(seconds: float) -> str:
    """Time left as the page shows it, in the one duration format of the CLI and `simulate`
    (`human_duration_ms`: `1h5m`, `4m9s`, `12s`), whole seconds rounded up; page.js mirrors it
    to keep it moving."""
    return human_duration_ms(max(0, int(-(-seconds // 1))) * 1000)


def _percent(used: float, limit: float | None) -> float | None:
    if not limit:
        return None
    return round(min(100.0, max(0.0, used / limit * 100)), 1)


def _seconds_between(start: str, end: str | None) -> float:
    if end is None:
        return 0.0
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


SPENT_CAPS = {"source_calls": "sourceCalls", "source_time": "sourceTimeMs"}
"""A source paused for using a cap of its own: the policy key to raise before resuming it."""


def resume_command(source_id: str, home: str | None, db_url_given: bool) -> str:
    """The exact command that resumes a paused source (shell-quoted)."""
    prefix = "ledger" if home is None or db_url_given else f"ledger --home {shlex.quote(home)}"
    return f"{prefix} source resume {shlex.quote(source_id)}"


_HEALTH_FIELDS = (
    "scope",
    "state",
    "consecutive_failures",
    "last_failure_kind",
    "last_failure_at",
    "last_success_at",
    "attempts_1h",
    "failures_1h",
    "probe_streak",
)


def health_rows(health: Any) -> list[dict[str, Any]]:
    """Per provider and model health rows from the document's `health` list (R-DIAG-6), in the
    shape `status --json` documents; a missing document block shows no section."""
    rows = []
    for entry in health if isinstance(health, list) else []:
        row = {field: entry.get(field) for field in _HEALTH_FIELDS}
        row["name"] = entry.get("target")
        rows.append(row)
    return rows


WAITS = {
    "leased": "a worker holds it",
    "retry_later": "waits for its retry time",
    "no_route": "due, but no route is eligible",
    "hourly_budget": "due, but the hourly call budget is used up",
    "daily_ceiling": "due, but the daily cost ceiling is reached",
    "waiting_for_worker": "due; no worker has claimed it yet",
}
"""The page's words for the document's `queue.oldest[].waits` codes."""
RECENT_SHOWN = 10


@dataclass(frozen=True)
class Blocker:
    """One reason work cannot run now, with the time it ends when known."""

    text: str
    at: str | None = None
    in_s: float = 0.0


def run_now(doc: dict[str, Any]) -> dict[str, Any]:
    """Whether a fresh source could be worked now, from the document alone: the routes it would
    get, or every reason it could not (no eligible route and when the first frees, the hourly
    budget used up, the daily ceiling reached)."""
    hourly, daily = doc["hourly"], doc["daily"]
    blocked: list[Blocker] = []
    if not doc["routes"]:
        at = doc.get("routes_retry_at")
        blocked.append(
            Blocker("no eligible route; the first frees at", at, _seconds_between(doc["now"], at))
            if at
            else Blocker("no eligible route (none frees by itself: see the reasons below)")
        )
    if hourly["next_free_at"]:
        blocked.append(
            Blocker(
                "the hourly call budget is used up; the next slot frees at",
                hourly["next_free_at"],
                _seconds_between(doc["now"], hourly["next_free_at"]),
            )
        )
    ceiling = daily["ceiling_usd"]
    if ceiling is not None and daily["spent_usd"] >= ceiling:
        blocked.append(Blocker(f"the daily cost ceiling ({usd(ceiling)}) is reached"))
    return {"can_run": not blocked, "blocked": blocked}


def queue_view(doc: dict[str, Any]) -> dict[str, Any]:
    """The document's `queue` block with the page's words for why each source waits."""
    queue = doc.get("queue") or {"due_now": 0, "next_due_at": None, "oldest": []}
    oldest = []
    for row in queue["oldest"]:
        why = WAITS.get(row["waits"], row["waits"])
        if row["waits"] == "retry_later" and row["retry_at"]:
            why += f" ({row['retry_at'][:10]} {row['retry_at'][11:19]} UTC)"
        elif row["waits"] == "leased" and row["lease_expires"]:
            why += f" (lease until {row['lease_expires'][:10]} {row['lease_expires'][11:19]} UTC)"
        oldest.append({**row, "why": why})
    return {
        **queue,
        "oldest": oldest,
        "next_due_s": _seconds_between(doc["now"], queue["next_due_at"]),
    }


def recent_view(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The newest attempts with their outcome (`kind/subkind` for a failure) and duration."""
    rows = []
    for a in doc.get("recent", [])[:RECENT_SHOWN]:
        outcome = a["status"] if not a["kind"] else f"{a['kind']}/{a['subkind'] or '-'}"
        took = "-" if a["duration_ms"] is None else human_duration_ms(a["duration_ms"])
        rows.append({**a, "outcome": outcome + (" (late)" if a["late"] else ""), "took": took})
    return rows


WINDOW_WORDS = {
    "tokensPerMinute": "tokens per minute",
    "inputTokensPerMinute": "input tokens per minute",
    "outputTokensPerMinute": "output tokens per minute",
    "tokensPerDay": "tokens per day",
}
"""The page's words for the document's `token_budgets[].window` keys (the policy's own keys)."""


def token_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each token window of the document's `token_budgets` with what it applies to (`provider
    alpha`, `scope night`), its use as a share of its limit, whether it is full and the seconds
    until it starts to free."""
    rows = []
    for w in doc.get("token_budgets") or []:
        on = ("scope", w["scope"]) if w["scope"] is not None else (w["kind"], w["target"])
        rows.append({
            **w,
            "on_kind": on[0],
            "on_name": on[1],
            "words": WINDOW_WORDS.get(w["window"], w["window"]),
            "pct": _percent(w["used"], w["limit"]),
            "use_text": f"{w['used']:,} / {w['limit']:,} tokens",
            "full": w["used"] >= w["limit"],
            "frees_s": _seconds_between(doc["now"], w["frees_at"]),
        })
    return rows


LIMIT_KIND_WORDS = {
    "tokens": "tokens",
    "input_tokens": "input tokens",
    "output_tokens": "output tokens",
}
"""The page's words for the document's `learned_limits[].kind` values."""


def learned_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each live reading of a provider's token limit (the document's `learned_limits`): its
    provider and model id, what the answer reported left (of its limit when it said), what is
    left for the next reservation (less the estimates granted since) as a share of what it
    reported, whether nothing is left and the seconds until it resets."""
    rows = []
    for x in doc.get("learned_limits") or []:
        provider, _, model_id = x["model"].partition("/")
        left = max(0, x["left"])
        of = x["limit"] if x["limit"] is not None else x["remaining"]
        words = LIMIT_KIND_WORDS.get(x["kind"], x["kind"])
        rows.append({
            **x,
            "provider": provider,
            "model_id": model_id,
            "words": words,
            "reported_text": f"{x['remaining']:,}" + (
                "" if x["limit"] is None else f" of {x['limit']:,}"),
            "left_text": f"{left:,} {words} left",
            "pct": _percent(of - left, of) if of > 0 else 100.0,
            "full": x["left"] <= 0,
            "resets_s": _seconds_between(doc["now"], x["resets_at"]),
        })  # fmt: skip
    return rows


def view(
    doc: dict[str, Any], home: str | None = None, db_url_given: bool = False
) -> dict[str, Any]:
    """What the template shows, derived from the document alone."""
    hourly, daily = doc["hourly"], doc["daily"]
    paused = [
        {
            **s,
            "resume": resume_command(s["id"], home, db_url_given),
            "spent_cap": SPENT_CAPS.get(s.get("pause_reason") or ""),
        }
        for s in doc["sources"]["list"]
        if s["state"] == "paused"
    ]
    return {
        "doc": doc,
        "next_free_s": _seconds_between(doc["now"], hourly["next_free_at"]),
        "hour_pct": _percent(hourly["used"], hourly["limit"]),
        "day_pct": _percent(daily["spent_usd"], daily["ceiling_usd"]),
        "chart": build_chart(doc.get("hours_24") or []),
        "patterns": PATTERNS,
        "paused": paused,
        "run": run_now(doc),
        "q": queue_view(doc),
        "recent": recent_view(doc),
        "tokens": token_rows(doc),
        "learned": learned_rows(doc),
        "health": health_rows(doc["health"]) if "health" in doc else None,
        "stale": [w for w in doc["policy"]["writers"] if w.get("live")],
    }


def render_page(
    doc: dict[str, Any],
    *,
    refresh_url: str | None = None,
    css_url: str = "/page.css",
    js_url: str = "/page.js",
    inline: bool = False,
    home: str | None = None,
    db_url_given: bool = False,
) -> str:
    """The status page for `doc` (the status document).

    Served (`inline=False`): links `css_url` and `js_url`; with `refresh_url` (the URL of this
    page, e.g. "/") the script fetches it every few seconds and swaps the content in place.
    Standalone (`inline=True`): one file with the assets inline and a CSP meta allowing only them;
    the script then only counts times down in the page's own clock. `home` (the state directory
    the document was read from) goes into the resume commands.
    """
    assets = render_assets()
    csp = None
    if inline:
        csp = (
            f"default-src 'none'; script-src {_sha256(assets.js)}; "
            f"style-src {_sha256(assets.css)}; img-src data:; base-uri 'none'; form-action 'none'"
        )
    template = _environment().get_template("page.html.j2")
    return template.render(
        **view(doc, home, db_url_given),
        inline=inline,
        csp=csp,
        css_url=css_url,
        js_url=js_url,
        css_text=assets.css.decode(),
        js_text=assets.js.decode(),
        refresh_url=None if inline else refresh_url,
        refresh_seconds=REFRESH_SECONDS,
    )
