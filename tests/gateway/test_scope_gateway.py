"""R-SC-1 and R-SC-3 over HTTP through real `ledger serve` processes: a gateway key's `inFlight`
scope is exact at the upstream (the stand-in counts the requests it answers at once), a settled
or expired reservation frees its slot at once, and a revoked or expired key is refused by every
service at once (two services on one PostgreSQL)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from ledger.clock import parse_iso_ms
from ledger.standin.server import Scripted, StandIn
from tests.support.backends import db_url, fresh_pg_database, pg_server_url, rows, write
from tests.support.gateway_keys import _ledger, _new_key
from tests.support.gateway_setup import STANDIN_KEY, gateway, gateway_catalog
from tests.support.serving import Served, running

IN_FLIGHT = 3
CLIENTS = 20
OPENAI_PATH = "/openai/v1/chat/completions"
ANTHROPIC_PATH = "/anthropic/v1/messages"
WAIT_S = 300.0  # generous: a loaded 2-core machine


def _policy(timeout_ms: int) -> dict[str, Any]:
    return {
        "callsPerHour": 100_000,
        "sourceCalls": 100_000,
        "timeoutMs": timeout_ms,
        "sourceTimeMs": 100 * timeout_ms,
        "scopes": {"slots": {"inFlight": IN_FLIGHT}},
    }


def _chat(source: str, stream: bool = True) -> dict[str, Any]:
    return {"model": "acme/a1", "stream": stream, "messages": [{"role": "user", "content": source}]}


def _headers(key: str, source: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "x-ledger-source": source}


def _stream_once(http: httpx.Client, key: str, source: str) -> tuple[int, Any, str | None]:
    """One streaming request read to its end: (status, error code or last data line,
    Retry-After)."""
    with http.stream("POST", OPENAI_PATH, json=_chat(source), headers=_headers(key, source)) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, r.json()["error"]["code"], r.headers.get("retry-after")
        data = [line for line in r.iter_lines() if line.startswith("data: ")]
        return 200, data[-1] if data else None, None


def _open_stream(stack: ExitStack, url: str, key: str, source: str) -> httpx.Response:
    return stack.enter_context(
        httpx.stream("POST", url + OPENAI_PATH, json=_chat(source),
                     headers=_headers(key, source), timeout=60)
    )  # fmt: skip


def _wait_for(check: Any, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def test_r_sc_1_in_flight_3_holds_20_concurrent_gateway_streams_to_3_at_the_upstream(
    home: Path,
) -> None:
    slow = Scripted(text="y" * 40, stream_pieces=4, first_event_delay_s=0.3, event_delay_s=0.3)
    # timeoutMs 10 min: nothing expires during the test, so only settles free slots
    with StandIn(default=slow) as standin, gateway(home, standin, **_policy(600_000)) as gw:
        key = _new_key(home, "burst")
        barrier = threading.Barrier(CLIENTS)
        done: list[Any] = []
        refused: Counter[tuple[int, str, bool]] = Counter()
        errors: list[BaseException] = []

        def client(i: int) -> None:
            try:
                with httpx.Client(base_url=gw.url, timeout=120) as http:
                    barrier.wait(WAIT_S)
                    end = time.monotonic() + WAIT_S
                    while time.monotonic() < end:
                        status, got, after = _stream_once(http, key, f"client-{i}")
                        if status == 200:
                            done.append(got)
                            return
                        refused[(status, got, after is not None and int(after) > 0)] += 1
                        time.sleep(0.05)  # a refused caller tries again (not a timing check)
                    raise AssertionError(f"client-{i} was never admitted")
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S + 60)
        assert errors == []
        assert done == ["data: [DONE]"] * CLIENTS  # every stream admitted and complete
        assert len(standin.requests) == CLIENTS  # a refused request never reached upstream
        assert standin.most_open == IN_FLIGHT  # never more than 3 at once, and 3 were reached
        assert set(refused) == {(429, "scope_in_flight", True)}  # with Retry-After (R-GW-6)


def test_r_sc_1_a_settled_gateway_stream_frees_its_slot_at_once(home: Path) -> None:
    # each held stream lasts ~10 s at the stand-in; nothing expires (timeoutMs 10 min)
    held = Scripted(text="z" * 40, stream_pieces=10, first_event_delay_s=1.0, event_delay_s=1.0)
    with StandIn(default=held) as standin, gateway(home, standin, **_policy(600_000)) as gw:
        key = _new_key(home, "hold")
        results: dict[str, tuple[int, Any, str | None]] = {}

        def hold(source: str) -> None:
            with httpx.Client(base_url=gw.url, timeout=120) as http:
                results[source] = _stream_once(http, key, source)

        threads = {s: threading.Thread(target=hold, args=(s,)) for s in ("a", "b", "c")}
        for thread in threads.values():
            thread.start()
        _wait_for(lambda: standin.open_now == IN_FLIGHT, "three streams open upstream")
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            status, code, after = _stream_once(http, key, "d")
            assert (status, code) == (429, "scope_in_flight")  # the fourth waits for a slot
            assert after is not None
            assert int(after) > 0
            standin.default = Scripted(text="quick")  # the next ones answer at once
            threads["a"].join(WAIT_S)
            assert results["a"] == (200, "data: [DONE]", None)  # settled before its end
            # the very next request is admitted: the settle freed the slot, not an expiry
            assert _stream_once(http, key, "e") == (200, "data: [DONE]", None)
        for thread in threads.values():
            thread.join(WAIT_S)
        assert standin.most_open == IN_FLIGHT


def test_r_sc_1_an_expired_gateway_reservation_frees_its_slot_at_once(home: Path) -> None:
    """The holder is `kill -9`ed mid-stream: nobody settles its reservations (R-GW-7), they
    hold the scope's slots until their deadline and free them then, with no settle. The
    deadline is far (10 min) so a slow restart cannot pass it; the test then brings it near in
    the file, as time would, and waits for it (ordering, not timing)."""
    endless = Scripted(text="w" * 200, stream_pieces=200, event_delay_s=0.5)
    timeout_ms = 600_000
    with StandIn(default=endless) as standin:
        policy = _policy(timeout_ms)
        with ExitStack() as stack:
            gw = stack.enter_context(gateway(home, standin, **policy))
            key = _new_key(home, "kill")
            answers = [_open_stream(stack, gw.url, key, s) for s in ("a", "b", "c")]
            for answer in answers:
                assert answer.status_code == 200
                assert next(answer.iter_lines()).startswith("data: ")
            gw.served.proc.send_signal(signal.SIGKILL)
            gw.served.proc.wait(30)
        standin.default = Scripted(text="after")
        with running(home, "--listen", "127.0.0.1:0", env={"BOLT_KEY": STANDIN_KEY}) as served:
            assert served.url is not None
            with httpx.Client(base_url=served.url, timeout=120) as http:
                r = http.post(OPENAI_PATH, json=_chat("d", False), headers=_headers(key, "d"))
                assert r.status_code == 429  # the killed holders still hold every slot
                assert r.json()["error"]["code"] == "scope_in_flight"
                after = int(r.headers["retry-after"])
                assert 0 < after <= timeout_ms // 1000  # when the first of them expires
                url = db_url(home, None)
                near = int(time.time() * 1000) + 2_000
                assert write(url, _NEAR_DEADLINE, near=near) == 3  # the three unsettled
                time.sleep(max(0.0, near / 1000 - time.time()) + 0.05)  # that deadline passed
                r = http.post(OPENAI_PATH, json=_chat("e", False), headers=_headers(key, "e"))
                assert r.status_code == 200, r.text  # the expired ones freed their slots at once
    assert standin.requests[-1].model == "a1"
    assert len(standin.requests) == 4  # d never reached upstream
    opened = rows(db_url(home, None), "SELECT status FROM reservations ORDER BY id")
    assert [s for (s,) in opened] == ["expired"] * 3 + ["succeeded"]  # never settled: expired


_NEAR_EXPIRY = "UPDATE gateway_keys SET expires_ms = :near"
_NEAR_DEADLINE = "UPDATE reservations SET deadline_ms = :near WHERE status = 'open'"


def _serve_two(stack: ExitStack, tmp_path: Path, standin: StandIn, db: str) -> list[Served]:
    services = []
    for name in ("a", "b"):
        home = tmp_path / name
        home.mkdir(mode=0o700)
        (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
        (home / "recovery.json").write_text(json.dumps(_policy(120_000)))
        services.append(stack.enter_context(running(
            home, "--listen", "127.0.0.1:0", db=db, env={"BOLT_KEY": STANDIN_KEY}
        )))  # fmt: skip
    return services


def _both_formats(url: str, key: str) -> list[tuple[int, str, str]]:
    """A non-streaming request in each wire format: (status, error type, error code or '')."""
    out = []
    with httpx.Client(base_url=url, timeout=120) as http:
        r = http.post(OPENAI_PATH, json=_chat("k", False), headers=_headers(key, "k"))
        error = r.json().get("error") or {}
        out.append((r.status_code, error.get("type", ""), error.get("code", "")))
        r = http.post(
            ANTHROPIC_PATH,
            json={"model": "bolt/b1", "max_tokens": 16,
                  "messages": [{"role": "user", "content": "k"}]},
            headers={"x-api-key": key, "x-ledger-source": "k", "anthropic-version": "2023-06-01"},
        )  # fmt: skip
        document = r.json()
        error = document.get("error") or {}
        shape = document.get("type") if r.status_code == 200 else error.get("type", "")
        out.append((r.status_code, shape, error.get("code", "")))
    return out


WORKS = [(200, "", ""), (200, "message", "")]
UNAUTHORIZED = [
    (401, "authentication_error", "unauthorized"),
    (401, "authentication_error", "unauthorized"),
]


def test_r_sc_3_a_revoked_key_is_refused_at_once_by_two_services_on_one_postgresql(
    tmp_path: Path,
) -> None:
    pg_server_url()
    with StandIn() as standin, fresh_pg_database() as db, ExitStack() as stack:
        services = _serve_two(stack, tmp_path, standin, db)
        key = _new_key(tmp_path / "a", "ci", db=db)
        urls = [s.url for s in services]
        assert all(urls)
        for url in urls:
            assert _both_formats(str(url), key) == WORKS
        revoked = _ledger(tmp_path / "b", "key", "revoke", "ci", db=db)
        assert revoked.returncode == 0, revoked.stderr
        for url in urls:  # the very next request on each: no caching window
            assert _both_formats(str(url), key) == UNAUTHORIZED
        assert len(standin.requests) == 4  # the refused ones never reached upstream
        for served in services:
            assert key[len("lgk_") + 17 :] not in "".join(served.log)


def test_r_sc_3_an_expired_key_is_refused_over_http(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin, **_policy(120_000)) as gw:
        # an hour, so a loaded machine makes both first calls long before it; then its expiry
        # is brought near in the file, as time would, and waited for (ordering, not timing)
        key = _new_key(home, "short", "--expires", "1h")
        listed = _ledger(home, "key", "list", "--json")
        (row,) = json.loads(listed.stdout)["keys"]
        assert parse_iso_ms(row["expires"]) is not None
        assert _both_formats(gw.url, key) == WORKS
        near = int(time.time() * 1000) + 1_000
        assert write(db_url(home, None), _NEAR_EXPIRY, near=near) == 1
        time.sleep(max(0.0, near / 1000 - time.time()) + 0.2)  # past its expiry
        assert _both_formats(gw.url, key) == UNAUTHORIZED
        assert len(standin.requests) == 2
