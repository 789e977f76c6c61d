"""`ledger demo` (SPEC section 14): the main job on an embedded default; no setup, no network.

A new temporary state directory (kept afterwards unless `--discard`; or an empty `--home`), a
catalog pointing at a StandIn on 127.0.0.1 (four providers: two OpenAI-compatible, two
Anthropic-format), a recovery.json, a fresh migrated SQLite ledger, a batch of sources, and the REAL
drain loop (`ledger worker run --once` with the echo handler) over real HTTP while the stand-in
fails on a script: 401, 429 with Retry-After, a model down for a second (503 with Retry-After)
that a recovery probe finds back, Anthropic's "credit balance is too low" 400, a content-policy
400, context overflow, truncated and invalid JSON, success.

Invariant: every step is the production code path; the demo only prepares files and the stand-in.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.api import Ledger
from ledger.errors import UsageError
from ledger.home import expand
from ledger.standin.server import Scripted, StandIn
from ledger.status.document import build_status, render_text
from ledger.store.queue import QueueTotals, totals
from ledger.worker.drain import drain
from ledger.worker.handler import echo_handler
from ledger.worker.queue import DrainSummary, ItemReport
from ledger.worker.stop import Stopper

DEFAULT_SOURCES = 12
MAX_SOURCES = 200

DEMO_POLICY: dict[str, Any] = {
    "defaultModel": "acme/swift-1",
    "callsPerHour": 30,
    "dailyEstimatedUsd": 0.5,
    "sourceCalls": 4,
    "sourceModels": 2,
    "timeoutMs": 10_000,
    "sourceTimeMs": 60_000,
    "replyTokens": 1024,
}

_MODELS: tuple[tuple[str, str, int, float, float, bool], ...] = (
    # provider, id, context window, $/MTok in, $/MTok out, reasoning
    ("acme", "swift-1", 128_000, 0.15, 0.6, False),
    ("bolt", "quill-3", 200_000, 0.25, 1.25, False),
    ("cirrus", "lite-2", 64_000, 0.4, 1.6, False),
    ("dyna", "sage-1", 128_000, 0.6, 2.4, False),
    ("acme", "pro-1", 128_000, 1.0, 4.0, False),
    ("bolt", "opus-3", 200_000, 2.0, 8.0, True),
    ("cirrus", "max-2", 128_000, 2.5, 10.0, True),
)

_OK = Scripted(text='{"summary": "ok", "facts": 3}', input_tokens=120, output_tokens=24)
OK_REPLY = _OK  # the stand-in's default reply (`ledger standin` serves the same script)


DEMO_KEY_ENV = "LEDGER_DEMO_KEY"
DEMO_KEY = "demo-key-for-the-local-stand-in"
"""Not a secret: the throw-away key the demo sends to its own stand-in on 127.0.0.1."""


CREDIT_BALANCE_LOW = (
    "Your credit balance is too low to access the Anthropic API. "
    "Please go to Plans & Billing to upgrade or purchase credits."
)
"""Anthropic's wording for an exhausted prepaid balance (a 400 invalid_request_error)."""


def demo_script() -> dict[str, list[Scripted]]:
    """Per-model replies, in the order a single worker meets them over 12 sources."""
    truncated = Scripted(text='{"summary": "the transcript sa', stop_reason="length")
    invalid = Scripted(text='{"summary": ok', input_tokens=120, output_tokens=8)
    # the time lite-2 is down: it asks for this long, and the next reply takes a little longer
    down = Scripted(status=503, retry_after="1")
    slow = Scripted(text=_OK.text, input_tokens=120, output_tokens=24, delay_s=1.2)
    return {
        # 01 ok; 02 truncated (`length`) -> its correction is invalid JSON; 03 401: acme cools
        "swift-1": [_OK, truncated, invalid, Scripted(status=401)],
        # 03 falls back here across providers (ok); 04 429 with Retry-After: quill cools
        "quill-3": [_OK, Scripted(status=429, retry_after="20")],
        # 04 falls back here (ok); 05: down, asking for 1 s, so the model cools 1 s (and 05 may
        # fall back at once); then one recovery probe (07) finds it back and it serves 08; 09's
        # request is refused by the provider's content policy: a guard, so 09 pauses and nothing
        # else is tried; 10's context overflows: lite cools 1 h
        "lite-2": [_OK, down, _OK, _OK,
                   Scripted(status=400, error_code="content_policy_violation"),
                   Scripted(status=400, error_code="context_length_exceeded")],
        # 05 falls back here (ok, despite the backoff it just earned); 06: the provider says its
        # credit balance is too low (quota: the provider dyna cools, not one model)
        "sage-1": [_OK, Scripted(status=400, error_message=CREDIT_BALANCE_LOW)],
        # 06's fallback ok (slowly, while lite-2 cools); 10's fallback, 11 and 12 ok; 02's third
        # try (the alternate model it is owed) is invalid JSON again: paused
        "opus-3": [slow, _OK, _OK, _OK, invalid],
    }


def demo_catalog(standin: StandIn) -> dict[str, Any]:
    """A catalog whose providers all point at the stand-in (availability `true`)."""
    return {
        "providers": {
            "acme": {"available": True, "api": "openai-chat", "baseUrl": standin.base_url_openai},
            "bolt": {
                "available": True,
                "api": "anthropic-messages",
                "baseUrl": standin.base_url_anthropic,
                "credentialEnv": DEMO_KEY_ENV,  # the stand-in, like Anthropic, requires a key
            },
            "cirrus": {"available": True, "api": "openai-chat", "baseUrl": standin.base_url_openai},
            "dyna": {
                "available": True,
                "api": "anthropic-messages",
                "baseUrl": standin.base_url_anthropic,
                "credentialEnv": DEMO_KEY_ENV,
            },
        },
        "models": [
            {
                "provider": provider,
                "id": model_id,
                "contextWindow": window,
                "maxOutputTokens": 8192,
                "reasoning": reasoning,
                "pricing": [{"inputUsdPerMTok": price_in, "outputUsdPerMTok": price_out}],
            }
            for provider, model_id, window, price_in, price_out, reasoning in _MODELS
        ],
    }


@dataclass(frozen=True)
class DemoResult:
    """What the demo did and the final ledger status."""

    home: str
    kept: bool
    wall_ms: int
    summary: DrainSummary
    totals: QueueTotals
    status: dict[str, Any]
    status_text: str
    calls_per_hour: int
    daily_ceiling_usd: float
    http_requests: int
    gateway: str = ""
    """The one gateway request the demo sends at the end, as one line."""
    standin_port: int = 0  # where the kept catalog's providers point (`ledger standin --port`)

    def to_json(self) -> dict[str, Any]:
        """JSON shape printed by `ledger demo --json`."""
        t = self.totals
        return {
            "home": self.home,
            "kept": self.kept,
            "wall_ms": self.wall_ms,
            "worker": self.summary.to_json(),
            "http_requests": self.http_requests,
            "facts": {
                "sources": dict(sorted(t.states.items())),
                "attempts": t.attempts,
                "fallbacks": t.fallbacks,
                "cross_provider_fallbacks": t.cross_provider_fallbacks,
                "corrections": t.corrections,
                "active_cooldowns": t.active_cooldowns,
                "hourly_used": t.hourly_used,
                "hourly_limit": self.calls_per_hour,
                "daily_spent_usd": t.daily_cost_micro / 1_000_000,
                "daily_ceiling_usd": self.daily_ceiling_usd,
            },
            "status": self.status,
        }


@contextmanager
def _state_dir(home: str | Path | None, discard: bool) -> Iterator[Path]:
    """A new temporary directory (kept unless `discard`), or an empty or new `--home`."""
    if home is None:
        path = Path(tempfile.mkdtemp(prefix="ledger-demo-"))  # created 0700
    else:
        if discard:
            raise UsageError("--discard applies only to the demo's own temporary directory")
        path = expand(str(home), "--home")
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise UsageError("the demo needs an empty or new state directory for --home")
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        yield path
    finally:
        if discard:
            shutil.rmtree(path, ignore_errors=True)


def run_demo(
    home: str | Path | None = None,
    *,
    sources: int = DEFAULT_SOURCES,
    stopper: Stopper | None = None,
    on_item: Callable[[ItemReport, DrainSummary], Any] | None = None,
    discard: bool = False,
) -> DemoResult:
    """Run the whole demo and return its facts and the final `ledger status`.

    The state directory is kept (so `ledger --home DIR status` shows the same ledger afterwards)
    unless `discard` removes the demo's own temporary directory at the end.
    """
    if not 1 <= sources <= MAX_SOURCES:
        raise UsageError(f"--sources must be between 1 and {MAX_SOURCES}")
    started = time.monotonic()
    with _state_dir(home, discard) as path, StandIn(demo_script(), default=_OK) as standin:
        (path / "catalog.json").write_text(json.dumps(demo_catalog(standin), indent=2))
        (path / "recovery.json").write_text(json.dumps(DEMO_POLICY, indent=2))
        ledger = Ledger.open(path, str(path / "ledger.db"), env={DEMO_KEY_ENV: DEMO_KEY})
        try:
            width = max(2, len(str(sources)))
            for n in range(1, sources + 1):
                ledger.add_source(
                    f"demo-{n:0{width}d}",
                    f"Summarise transcript {n} of the demo batch as one JSON document.",
                )
            summary = drain(
                ledger,
                echo_handler,
                worker_id="demo-worker",
                stopper=stopper,
                on_item=on_item,
            )
            facts = totals(ledger.db, ledger.policy.calls_per_hour)
            status = build_status(ledger)
            text = render_text(status)
            requests = len(standin.requests)  # the worker's
            gateway = _gateway_line(ledger)  # after the worker's status: the demo ends with it
        finally:
            ledger.close()
        standin_port = standin.port
    return DemoResult(
        home=str(path),
        kept=not discard,
        wall_ms=int((time.monotonic() - started) * 1000),
        summary=summary,
        totals=facts,
        status=status,
        status_text=text,
        calls_per_hour=int(DEMO_POLICY["callsPerHour"]),
        daily_ceiling_usd=float(DEMO_POLICY["dailyEstimatedUsd"]),
        http_requests=requests,
        gateway=gateway,
        standin_port=standin_port,
    )


GATEWAY_MODEL = "acme/swift-1"


def _gateway_line(ledger: Ledger) -> str:
    """One request through the gateway (SPEC section 19), as a job in any language would send
    it; without the service extra (FastAPI), one line saying what to install."""
    try:
        from ledger.service.local import one_request  # lazy: FastAPI is an optional extra
    except ImportError:
        return "the gateway needs the serve extra: python -m pip install -e '.[serve]' (checkout)"
    shown = one_request(ledger, GATEWAY_MODEL, "demo-gateway", "Say hello as one JSON document.")
    return shown.line(GATEWAY_MODEL)
