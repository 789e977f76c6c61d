"""R-GW-4, R-POL-9 (issue 31 fault table, last row): a primary that is down for a while and comes
back. Against a real `ledger serve` and the stand-in: the backup serves while the primary cools;
once the cooldown has ended, exactly one request goes to the primary as the recovery probe (a
request meanwhile is served by the backup, `probing`); after the probe succeeded the primary
serves again. `ledger serve` reads the real clock, so the test waits out the 1 min transport
cooldown (read from the ledger, not assumed).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import openai
import pytest

from ledger.api import Ledger
from ledger.clock import now_ms
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import Gateway, gateway


def _ask(client: openai.OpenAI) -> tuple[str, str | None]:
    raw = client.chat.completions.with_raw_response.create(
        model="acme/a1", messages=[{"role": "user", "content": "x"}]
    )
    assert raw.parse().model == raw.headers["x-ledger-model"]
    return raw.headers["x-ledger-model"], raw.headers.get("x-ledger-fallback-from")


def _asked(gw: Gateway) -> Counter[str | None]:
    return Counter(gw.models_asked())


def _cooldown_until(home: Path, target: str) -> int | None:
    with Ledger.open(home).db.engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT max(until_ms) FROM cooldowns WHERE scope = 'model' AND target = ?", (target,)
        ).one()
    return None if row[0] is None else int(row[0])


@pytest.mark.slow
def test_r_pol_9_primary_down_for_a_while_comes_back_through_the_recovery_probe(
    home: Path,
) -> None:
    down = [Scripted(status=503)] * 20
    with StandIn({"a1": down}) as standin, gateway(home, standin) as gw:
        client = gw.openai()
        # down: the same-model retry, then the backup (R-GW-4); the second strike cools a1
        assert _ask(client) == ("cirrus/c1", "acme/a1")
        assert _asked(gw) == {"a1": 2, "c1": 1}
        until = _cooldown_until(home, "acme/a1")
        assert until is not None
        assert until > now_ms()
        # cooling: the backup serves, the primary is not asked
        assert _ask(client) == ("cirrus/c1", "acme/a1")
        assert _asked(gw) == {"a1": 2, "c1": 2}
        # the primary comes back (its probe answers slowly, so a request meets it in flight)
        standin.set_script("a1", [Scripted(delay_s=3)])
        time.sleep(max(0.0, (until - now_ms()) / 1000) + 0.5)
        probe: list[tuple[str, str | None]] = []
        thread = threading.Thread(target=lambda: probe.append(_ask(gw.openai())))
        thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _asked(gw)["a1"] < 3:
            time.sleep(0.05)
        assert _asked(gw) == {"a1": 3, "c1": 2}  # the probe: one request to the primary
        # while the probe is in flight every other request is `probing`: the backup serves
        assert _ask(client) == ("cirrus/c1", "acme/a1")
        thread.join(30)
        assert probe == [("acme/a1", None)]
        assert _asked(gw) == {"a1": 3, "c1": 3}
        # the probe succeeded: the primary serves again, first time, no probe
        assert _ask(client) == ("acme/a1", None)
        assert _ask(client) == ("acme/a1", None)
        assert _asked(gw) == {"a1": 5, "c1": 3}
    with Ledger.open(home).db.engine.connect() as conn:
        probes = conn.exec_driver_sql("SELECT count(*) FROM probes").scalar_one()
    assert probes == 0  # probing ended with the successful probe
