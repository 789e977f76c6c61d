"""R-GW-6a with the official Node SDKs (`openai`, `@anthropic-ai/sdk`, pinned in
tests/node/package-lock.json; `npm ci --prefix tests/node` installs them) through a real `ledger
serve`: with their default retries (2) they raise at once on a refusal an hour away, and retry one
that frees within 60 s. Both sleep whatever Retry-After says before a retry, so without
`x-should-retry: false` a refused call would hang for about two hours printing nothing.

tests/node/refusal.cjs records the SDK's retry sleeps instead of sleeping them; the service's own
request counter says how many requests it saw."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.refusal_setup import CHAT, MESSAGES, SCOPE, cool_every_provider, refused_seen
from tests.support.refusal_setup import refusing_gateway as refusing

NODE_DIR = Path(__file__).parents[1] / "node"
SCRIPT = NODE_DIR / "refusal.cjs"
PACKAGES = {"openai": "openai", "anthropic": "@anthropic-ai/sdk"}
LONG_WAIT_S = 60  # R-GW-6a


def _node_or_skip(sdk: str) -> str:
    """Skipped only locally: under CI (CI=true, where .ci/run installs them) a missing node or
    SDK fails."""
    missing = None
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        missing = "the Node SDK tests need node and npm on PATH"
    elif not (NODE_DIR / "node_modules" / PACKAGES[sdk] / "package.json").exists():
        missing = f"{PACKAGES[sdk]} is not installed: run `npm ci --prefix tests/node`"
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {missing}")
        pytest.skip(missing)
    assert node is not None
    return node


def _run(node: str, sdk: str, url: str, key: str) -> dict[str, Any]:
    done = subprocess.run(
        [node, str(SCRIPT), sdk, url, key], cwd=NODE_DIR, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


ROUTES = [pytest.param("openai", CHAT, id="openai"),
          pytest.param("anthropic", MESSAGES, id="anthropic")]  # fmt: skip


@pytest.mark.parametrize(("sdk", "route"), ROUTES)
def test_r_gw_6a_a_refusal_an_hour_away_is_raised_at_once_by_the_node_sdks(
    home: Path, sdk: str, route: str
) -> None:
    node = _node_or_skip(sdk)
    with refusing(home) as (gw, key):
        got = _run(node, sdk, gw.url, key)
        assert refused_seen(gw, route) == 1  # the SDK never came back
    assert got["ok"] is False
    assert got["status"] == 429
    assert got["sleeps"] == []  # nor meant to, after a sleep
    assert got["shouldRetry"] == "false"
    assert int(got["retryAfter"]) > 3000
    assert f"refused: scope_hourly_budget for scope {SCOPE}; retry after 20" in got["message"]


@pytest.mark.parametrize(("sdk", "route"), ROUTES)
def test_r_gw_6a_a_refusal_within_a_minute_is_retried_by_the_node_sdks(
    home: Path, sdk: str, route: str
) -> None:
    node = _node_or_skip(sdk)
    with refusing(home) as (gw, _):
        cool_every_provider(gw)
        got = _run(node, sdk, gw.url, gw.token)  # the service token: no scope in the way
        assert refused_seen(gw, route) == 3  # the first answer and both default retries
    assert got["ok"] is False
    assert got["status"] == 429
    assert len(got["sleeps"]) == 2
    assert all(0 < ms <= 30_000 for ms in got["sleeps"])  # its Retry-After, in ms
    assert got["shouldRetry"] is None
    assert 0 < int(got["retryAfter"]) <= LONG_WAIT_S
