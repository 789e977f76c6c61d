"""`ledger serve` start and stop (R-SRV-3, R-SRV-5): kill -9 during a burst loses no acknowledged
reservation, SIGTERM lets requests in flight finish and exits 0, a stale socket is replaced, a
second service on the same state directory is refused (exit 4)."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx

from ledger.client import LedgerClient
from ledger.errors import LedgerError
from tests.support.backends import rows
from tests.support.ledgers import write_policy
from tests.support.procs import write_lock_held
from tests.support.serving import Served, running, serve_argv, start


def _burst(
    served_socket: Path, threads: int, per_thread: int, acked: list[str], stop: threading.Event
) -> list[threading.Thread]:
    """Threads reserving with distinct request ids; each 2xx answer is recorded as acknowledged."""

    def run(tag: int) -> None:
        client = LedgerClient(served_socket, timeout_s=30)
        try:
            for i in range(per_thread):
                if stop.is_set():
                    return
                request_id = f"burst-{tag}-{i}"
                try:
                    client.reserve(f"src-{tag}-{i}", "alpha/small", request_id=request_id)
                except LedgerError:
                    continue  # the service died under it: not acknowledged
                acked.append(request_id)
        finally:
            client.close()

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    return workers


def test_r_srv_3_kill_9_during_a_burst_keeps_every_acknowledged_reservation(home: Path) -> None:
    write_policy(home, callsPerHour=100_000)
    served = start(home)
    acked: list[str] = []
    stop = threading.Event()
    workers = _burst(served.socket, 6, 400, acked, stop)
    while len(acked) < 60:
        time.sleep(0.01)
    served.proc.kill()  # SIGKILL mid-burst
    served.proc.wait()
    served.close()
    stop.set()
    for w in workers:
        w.join(60)
    assert served.socket.exists()  # the killed service left its socket behind
    url = f"sqlite:///{home / 'ledger.db'}"
    stored = [r[0] for r in rows(url, "SELECT request_id FROM reservations")]
    assert len(stored) == len(set(stored))  # never twice
    assert set(acked) <= set(stored)  # every acknowledged reservation is there
    attempted = {f"burst-{t}-{i}" for t in range(6) for i in range(400)}
    assert set(stored) <= attempted  # nothing else
    # the stale socket is replaced at start; the caller retries what it never saw acknowledged:
    # replayed, never a second slot
    with running(home) as again, LedgerClient(again.socket) as client:
        for request_id in sorted(set(stored) - set(acked)):
            tag, i = request_id.split("-")[1:]
            replay = client.reserve(f"src-{tag}-{i}", "alpha/small", request_id=request_id)
            assert replay.replayed
    after = [r[0] for r in rows(url, "SELECT request_id FROM reservations")]
    assert sorted(after) == sorted(stored)
    assert rows(url, "PRAGMA integrity_check") == [("ok",)]


def test_r_srv_5_sigterm_lets_requests_in_flight_finish_then_exits_0(home: Path) -> None:
    write_policy(home, callsPerHour=1000, busyTimeoutMs=30_000)
    served = start(home, "--grace", "20")
    answers: list[int] = []
    with write_lock_held(home / "ledger.db"):  # released at the end: the requests complete

        def reserve(i: int) -> None:
            with served.client() as http:
                answer = http.post("/v1/reserve", json={"source": f"s{i}", "model": "alpha/small"})
                answers.append(answer.status_code)

        in_flight = [threading.Thread(target=reserve, args=(i,)) for i in range(8)]
        for t in in_flight:
            t.start()
        _wait_in_flight(served, 8)  # all 8 wait for the write lock inside the service
        assert answers == []
        served.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert _late_request_status(served) in ("refused", 503)  # new requests: not served
        assert served.proc.poll() is None  # still finishing what it accepted
    for t in in_flight:
        t.join(60)
    assert served.proc.wait(timeout=30) == 0
    served.close()
    assert sorted(answers) == [200] * 8
    stored = rows(f"sqlite:///{home / 'ledger.db'}", "SELECT count(*) FROM reservations")
    assert stored == [(8,)]
    assert not served.socket.exists()


def _wait_in_flight(served: Served, count: int) -> None:
    """Until `count` reserves are inside the service's group commit (in the transaction waiting
    for the lock, or queued behind it): a condition, not a sleep (a loaded machine may take
    seconds to deliver them)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with served.client(timeout_s=10) as http:
            text = http.get("/metrics").text
        inside = sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(("ledger_commit_waiting ", "ledger_commit_in_progress "))
        )
        if inside >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} requests reached the service")


def _late_request_status(served: Served) -> str | int:
    try:
        with served.client(timeout_s=5) as late:
            return late.get("/healthz").status_code
    except httpx.TransportError:
        return "refused"


def test_r_srv_5_a_stale_socket_file_is_replaced_at_start(home: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(home / "ledger.sock"))
    stale.close()  # a dead service's socket: the file stays, nobody listens
    with running(home) as served, served.client() as http:
        assert http.get("/healthz").status_code == 200


def test_r_srv_5_a_second_service_on_the_same_state_directory_exits_4(home: Path) -> None:
    with running(home) as served:
        second = subprocess.run(
            serve_argv(home), capture_output=True, text=True, timeout=60, check=False
        )
        assert second.returncode == 4
        assert second.stderr.strip().splitlines() == [
            "ledger: another `ledger serve` is already running on this state directory"
        ]
        with served.client() as http:  # the first one is untouched, socket and all
            assert http.get("/healthz").status_code == 200


def test_r_srv_5_a_request_past_the_grace_gets_a_json_503_and_the_service_still_exits_0(
    home: Path,
) -> None:
    write_policy(home, busyTimeoutMs=120_000)
    served = start(home, "--grace", "1")
    answers: list[httpx.Response] = []
    with write_lock_held(home / "ledger.db"):

        def reserve() -> None:
            body = {"source": "s", "model": "alpha/small"}
            with served.client(timeout_s=120) as http:
                answers.append(http.post("/v1/reserve", json=body))

        stuck = threading.Thread(target=reserve)
        stuck.start()
        time.sleep(1.0)
        served.proc.send_signal(signal.SIGTERM)
        # the lock stays held for minutes: the service must not wait for the stuck write
        assert served.proc.wait(timeout=60) == 0
        stuck.join(60)
    served.close()
    assert [a.status_code for a in answers] == [503]
    assert answers[0].json()["error"]["code"] == "unavailable"
    log = "".join(served.log)
    assert "Traceback" not in log
    assert rows(f"sqlite:///{home / 'ledger.db'}", "SELECT count(*) FROM reservations") == [(0,)]


def test_r_srv_1_a_state_directory_too_deep_for_a_socket_is_one_line_exit_2(
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    result = subprocess.run(
        serve_argv(deep), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "too long for a unix socket" in lines[0]
