"""Refusals with a long and a short wait through a real `ledger serve` (R-GW-6a), shared by the
Python and Node SDK tests: a gateway key under a scope whose one call per hour is spent (the next
request is refused `scope_hourly_budget` for about an hour), and every provider of the stand-in
catalog cooling for half a minute (refused with a Retry-After of at most 30 s)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ledger.standin.server import StandIn
from tests.support.gateway_setup import Gateway, gateway

SCOPE = "team-a"
PROVIDERS = ("acme", "cirrus", "bolt", "delta")
SHORT_COOLDOWN = "30s"
POLICY = {
    "callsPerHour": 1000,
    "sourceCalls": 1000,
    "scopes": {SCOPE: {"callsPerHour": 1}},
}
CHAT = "/openai/v1/chat/completions"
MESSAGES = "/anthropic/v1/messages"


def new_key(home: Path) -> str:
    """A gateway key under SCOPE, made with the real CLI."""
    made = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "key", "create", "sdk",
         "--scope", SCOPE],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


@contextmanager
def refusing_gateway(home: Path) -> Iterator[tuple[Gateway, str]]:
    """The served gateway and a key whose scope has spent its hour: its next request is refused
    with a Retry-After of about 3600 s."""
    with StandIn() as standin, gateway(home, standin, **POLICY) as gw:
        key = new_key(home)
        spent = httpx.post(
            gw.url + CHAT,
            headers={"authorization": f"Bearer {key}"},
            json={"model": "acme/a1", "messages": [{"role": "user", "content": "spend"}]},
            timeout=60,
        )
        assert spent.status_code == 200, spent.text
        yield gw, key


def cool_every_provider(gw: Gateway) -> None:
    """Every provider cooling for SHORT_COOLDOWN (over the service's socket, as `ledger cooldown
    set` does): a request is refused with a Retry-After of at most 30 s."""
    with gw.served.client() as http:
        for provider in PROVIDERS:
            answer = http.post("/v1/cooldowns", json={"target": provider,
                                                      "duration": SHORT_COOLDOWN})
            assert answer.status_code == 200, answer.text


def refused_seen(gw: Gateway, route: str) -> int:
    """The refusals the service answered on a gateway route (its own request counter)."""
    metrics = httpx.get(
        gw.url + "/metrics", headers={"authorization": f"Bearer {gw.token}"}, timeout=60
    )
    for family in text_string_to_metric_families(metrics.text):
        for sample in family.samples:
            if (
                sample.name == "ledger_gateway_requests_total"
                and sample.labels == {"route": route, "outcome": "refused"}
            ):
                return int(sample.value)
    return 0
