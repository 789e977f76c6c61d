"""R-GW-8: a gateway key's verification (its read and its last-used write) never runs on the
service's event loop. Another process holds the ledger's write lock while a never-used key's
request is in flight: `/healthz` and the keyed request itself are answered at once, and the key's
last use is written once the lock is free.

Before: the first use of a key wrote `last_used_ms` on the event loop, waiting for the lock, so
every request to the service waited with it (`/healthz` took 3.70 s behind a 4 s hold)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.standin.server import StandIn
from ledger.store import sqlite_driver
from tests.support.gateway_setup import gateway
from tests.support.writelock_setup import lock_file_held

FAST_S = 1.0
"""Well below how long the lock is held (until the test lets it go, at least 10 s here)."""
STATE_WAIT_S = 120.0


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll a state until it holds (the bound is a failure, never the expected path)."""
    give_up = time.monotonic() + STATE_WAIT_S
    while not condition():
        assert time.monotonic() < give_up, f"never happened: {what}"
        time.sleep(0.02)


def _lock_waiters(lock: Path) -> int:
    """Lock requests blocked in the kernel on the write lock file (`->` lines of /proc/locks)."""
    inode = f":{os.stat(lock).st_ino} "
    with open("/proc/locks", encoding="ascii") as locks:
        return sum(1 for line in locks if "->" in line and inode in line)


def _last_used(home: Path) -> int | None:
    with sqlite_driver.connect(home / "ledger.db") as conn:
        (value,) = conn.execute("SELECT last_used_ms FROM gateway_keys").fetchone()
    return None if value is None else int(value)


def test_r_gw_8_a_held_write_lock_never_stalls_a_new_keys_request_or_healthz(
    home: Path,
) -> None:
    # the busy timeout outlasts the hold whatever the machine's load: the last-used write waits
    # for the lock (in its own thread) rather than giving up while the test still holds it
    policy = {"scopes": {"team": {"inFlight": 4}}, "busyTimeoutMs": 600_000}
    with StandIn() as standin, gateway(home, standin, **policy) as gw:
        made = CliRunner().invoke(cli, ["--home", str(home), "key", "create", "ci", "--scope",
                                        "team"])  # fmt: skip
        assert made.exit_code == 0, made.output
        key = made.stdout.strip()
        assert _last_used(home) is None
        lock = home / "ledger.db-writelock"
        answers: dict[str, httpx.Response] = {}

        def keyed() -> None:
            answers["keyed"] = httpx.get(
                gw.url + "/openai/v1/models", headers={"authorization": f"Bearer {key}"},
                timeout=60,
            )  # fmt: skip

        with lock_file_held(lock), gw.served.client(timeout_s=30) as socket_client:
            waiting_before = _lock_waiters(lock)
            caller = threading.Thread(target=keyed, daemon=True)
            caller.start()
            # the key's last-used write has begun: it waits on the lock (or, on a service
            # that does not wait for it, the keyed answer is already back)
            _wait_for(
                lambda: "keyed" in answers or _lock_waiters(lock) > waiting_before,
                "the key's last-used write waiting on the lock",
            )
            started = time.monotonic()
            try:
                health = socket_client.get("/healthz")
            except httpx.TimeoutException:
                pytest.fail("/healthz did not answer in 30 s behind a held write lock")
            took = time.monotonic() - started
            assert health.status_code == 200
            assert took < FAST_S, f"/healthz took {took:.2f} s behind a held write lock"
            caller.join(FAST_S)
            assert "keyed" in answers, "the keyed request waited for the write lock"
            assert answers["keyed"].status_code == 200
            assert _last_used(home) is None  # the lock is still held: nothing written yet
        _wait_for(lambda: _last_used(home) is not None, "the key's last use written")
        listed = CliRunner().invoke(cli, ["--home", str(home), "key", "list", "--json"])
        assert json.loads(listed.output)["keys"][0]["last_used"] is not None
