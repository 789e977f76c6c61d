"""One contract for three ways in (R-SRV-2, R-SRV-3, R-SRV-7): the same reserve / settle / select /
status scenarios through the library (`Ledger`), the CLI (`ledger … --json` processes) and the
service (`LedgerClient` over `ledger serve`) give the same decisions; all three writing one ledger
at once keep budgets exact, and two services on one PostgreSQL database do too."""

from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest

from ledger.api import Ledger
from ledger.classify import classify_http, classify_kind
from ledger.client import LedgerClient
from ledger.clock import now_ms
from ledger.errors import LedgerError, Refused
from ledger.kinds import FailureKind
from ledger.records import Cancelled, Failed, Outcome, Success
from tests.support.backends import fresh_pg_database, rows
from tests.support.ledgers import TEST_CATALOG
from tests.support.procs import race_worker, write_home
from tests.support.serving import running

TIME = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z")


def _timeless(value: Any) -> Any:
    """A decision without its timestamps (each way in runs on its own clock)."""
    if isinstance(value, str):
        return TIME.sub("<t>", value)
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in ("created", "deadline")}
    return value


class Way(Protocol):
    """One way into the ledger, answering in the library's JSON shapes."""

    def reserve(self, source: str, model: str, **kw: Any) -> dict[str, Any]: ...
    def settle(self, reservation: int, outcome: Outcome) -> dict[str, Any]: ...
    def select(self, source: str, **kw: Any) -> dict[str, Any]: ...
    def hourly_used(self) -> int: ...


class LibraryWay:
    """`Ledger` in this process."""

    def __init__(self, ledger: Ledger | LedgerClient) -> None:
        self.ledger = ledger

    def reserve(self, source: str, model: str, **kw: Any) -> dict[str, Any]:
        try:
            return self.ledger.reserve(source, model, **kw).to_json()
        except Refused as refusal:
            return {"error": {"code": refusal.reason}}

    def settle(self, reservation: int, outcome: Outcome) -> dict[str, Any]:
        return self.ledger.settle(reservation, outcome).to_json()

    def select(self, source: str, **kw: Any) -> dict[str, Any]:
        return self.ledger.select(source, **kw).to_json(self.ledger.catalog)

    def hourly_used(self) -> int:
        if isinstance(self.ledger, LedgerClient):
            return int(self.ledger.status()["hourly"]["used"])
        from ledger.status.document import build_status

        return int(build_status(self.ledger)["hourly"]["used"])


class CliWay:
    """`ledger … --json`, one process per call, as a shell script would."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def _run(self, *args: str) -> dict[str, Any]:
        result = subprocess.run(
            [sys.executable, "-m", "ledger", "--home", str(self.home), *args, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode in (0, 3), result.stderr
        doc: dict[str, Any] = json.loads(result.stdout)
        return doc

    def reserve(self, source: str, model: str, **kw: Any) -> dict[str, Any]:
        args = ["reserve", source, "--model", model]
        if "request_id" in kw:
            args += ["--request-id", kw["request_id"]]
        if "after" in kw:
            args += ["--after", str(kw["after"])]
        doc = self._run(*args)
        if "error" in doc:
            return {"error": {"code": doc["error"]["code"]}}
        return doc

    def settle(self, reservation: int, outcome: Outcome) -> dict[str, Any]:
        args = ["settle", str(reservation)]
        if isinstance(outcome, Success):
            args += ["--ok"] + (["--finish"] if outcome.finish else [])
        elif isinstance(outcome, Cancelled):
            args += ["--cancelled"]
        elif outcome.classification.subkind.startswith("http_"):
            args += ["--http-status", outcome.classification.subkind.removeprefix("http_")]
        else:
            args += ["--kind", outcome.classification.kind.value]
            if outcome.classification.reason:
                args += ["--reason", outcome.classification.reason]
        return self._run(*args)

    def select(self, source: str, **kw: Any) -> dict[str, Any]:
        args = ["select", source]
        if kw.get("after_failure"):
            args += [
                "--after-failure",
                kw["after_failure"].value,
                "--failed-model",
                kw["failed_model"],
            ]
        for key in sorted(kw.get("tried", ())):
            args += ["--tried", key]
        return self._run(*args)

    def hourly_used(self) -> int:
        return int(self._run("status")["hourly"]["used"])


def scenario(way: Way) -> list[Any]:
    """Budgets, a rate limit and its fallback, a correction, a pause, a replay, the status."""
    seen: list[Any] = []
    first = way.reserve("s1", "alpha/small", request_id="job-1")
    seen.append(first)
    seen.append(way.reserve("s1", "alpha/small", request_id="job-1"))  # replayed
    limited = way.settle(first["id"], Failed(classify_http(429, {}, None, now_ms())))
    seen.append(limited)
    seen.append(way.reserve("s2", "alpha/small"))  # model_cooldown
    seen.append(
        way.select(
            "s1",
            after_failure=FailureKind.RATE_LIMIT,
            failed_model="alpha/small",
            tried=frozenset({"alpha/small"}),
        )
    )
    fallback = way.reserve("s1", "beta/mid", after=first["id"])
    seen.append(fallback)
    seen.append(way.settle(fallback["id"], Success(finish=True)))
    seen.append(way.reserve("s1", "beta/mid"))  # source_settled
    out = way.reserve("s3", "beta/mid")
    seen.append(way.settle(out["id"], Failed(classify_kind("invalid_output", "json_contract"))))
    seen.append(way.reserve("s3", "beta/mid", after=out["id"]))  # the correction
    unsafe = way.reserve("s4", "alpha/big")
    seen.append(way.settle(unsafe["id"], Failed(classify_kind("safety"))))
    seen.append(way.reserve("s4", "alpha/big"))  # source_paused
    seen.append(way.reserve("s5", "alpha/big"))  # the 6th call: the last slot
    seen.append(way.reserve("s6", "alpha/big"))  # shared_hourly_budget
    seen.append(way.hourly_used())
    timeless: list[Any] = _timeless(seen)
    return timeless


def _fresh_home(root: Path, name: str) -> Path:
    home = root / name
    write_home(home, TEST_CATALOG, callsPerHour=6)
    return home


def test_r_srv_7_library_cli_and_client_make_the_same_decisions(tmp_path: Path) -> None:
    library = Ledger.open(_fresh_home(tmp_path, "lib"), env={})
    try:
        by_library = scenario(LibraryWay(library))
    finally:
        library.close()
    by_cli = scenario(CliWay(_fresh_home(tmp_path, "cli")))
    svc = _fresh_home(tmp_path, "svc")
    with running(svc) as served, LedgerClient(served.socket, home=svc) as client:
        by_client = scenario(LibraryWay(client))
    assert by_library == by_cli == by_client
    codes = [d["error"]["code"] for d in by_library if isinstance(d, dict) and "error" in d]
    assert codes == ["model_cooldown", "source_settled", "source_paused", "shared_hourly_budget"]
    assert by_library[1]["replayed"] is True
    assert by_library[-1] == 6


def _client_racer(socket: Path, tag: int, attempts: int, out: list[Any]) -> None:
    granted, refused = [], Counter[str]()
    with LedgerClient(socket) as client:
        for i in range(attempts):
            try:
                granted.append(client.reserve(f"svc-{tag}-{i}", "alpha/small").id)
            except Refused as refusal:
                refused[refusal.reason] += 1
    out.append((granted, refused))


def _cli_racer(home: Path, tag: int, attempts: int, out: list[Any]) -> None:
    granted, refused = [], Counter[str]()
    for i in range(attempts):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "ledger",
                "--home",
                str(home),
                "reserve",
                f"cli-{tag}-{i}",
                "--model",
                "alpha/small",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        doc = json.loads(result.stdout)
        if result.returncode == 0:
            granted.append(doc["id"])
        else:
            assert result.returncode == 3, result.stderr
            refused[doc["error"]["code"]] += 1
    out.append((granted, refused))


def _threads(target: Callable[..., None], args: list[tuple[Any, ...]]) -> Iterator[None]:
    threads = [threading.Thread(target=target, args=a) for a in args]
    for t in threads:
        t.start()
    yield
    for t in threads:
        t.join(300)


@contextmanager
def _all(*groups: Iterator[None]) -> Iterator[None]:
    for group in groups:
        next(group)
    yield
    for group in groups:
        next(group, None)


@pytest.mark.slow
def test_r_srv_3_service_cli_and_library_share_one_ledger_exactly(tmp_path: Path) -> None:
    budget = 40
    home = tmp_path / "state"
    write_home(home, TEST_CATALOG, callsPerHour=budget)
    results: list[Any] = []
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    queue = ctx.Queue()
    with running(home) as served:
        library = [
            ctx.Process(target=race_worker, args=(str(home), barrier, tag, 15, False, queue))
            for tag in range(2)
        ]
        with _all(
            _threads(_client_racer, [(served.socket, t, 15, results) for t in range(3)]),
            _threads(_cli_racer, [(home, t, 4, results) for t in range(3)]),
        ):
            for proc in library:
                proc.start()
            reports = [queue.get(timeout=300) for _ in library]
            for proc in library:
                proc.join(60)
    for report in reports:
        assert report["errors"] == []
        results.append((report["granted"], Counter(report["refused"])))
    granted = [rid for ids, _ in results for rid in ids]
    refused = sum((r for _, r in results), Counter[str]())
    attempts = 3 * 15 + 3 * 4 + 2 * 15
    assert len(granted) == budget  # exact: never more, never fewer than the budget allows
    assert refused == {"shared_hourly_budget": attempts - budget}
    stored = [r[0] for r in rows(f"sqlite:///{home / 'ledger.db'}", "SELECT id FROM reservations")]
    assert sorted(stored) == sorted(granted)


@pytest.mark.slow
def test_r_srv_3_two_services_on_one_postgresql_database_stay_exact(tmp_path: Path) -> None:
    budget = 30
    with fresh_pg_database() as url:
        homes = [tmp_path / "a", tmp_path / "b"]
        for home in homes:
            write_home(home, TEST_CATALOG, callsPerHour=budget)
        Ledger.open(homes[0], url, env={}).close()  # migrate once before the race
        results: list[Any] = []
        with running(homes[0], db=url) as one, running(homes[1], db=url) as two:
            args = [
                (s.socket, t + 10 * n, 12, results)
                for n, s in enumerate((one, two))
                for t in range(3)
            ]
            with _all(_threads(_client_racer, args)):
                pass
        granted = [rid for ids, _ in results for rid in ids]
        refused = sum((r for _, r in results), Counter[str]())
        assert len(granted) == budget
        assert refused == {"shared_hourly_budget": 6 * 12 - budget}
        assert sorted(r[0] for r in rows(url, "SELECT id FROM reservations")) == sorted(granted)


def test_r_srv_7_client_raises_the_library_exceptions(home: Path) -> None:
    with running(home) as served, LedgerClient(served.socket) as client:
        with pytest.raises(LedgerError) as bad:
            client.reserve("s", "nope/model")
        assert type(bad.value).__name__ == "UsageError"
        assert bad.value.exit_code == 2
        with pytest.raises(LedgerError) as missing:
            client.settle(12345, Cancelled())
        assert type(missing.value).__name__ == "NotFoundError"
    from ledger.errors import ServiceUnreachableError

    with LedgerClient(home / "ledger.sock") as gone, pytest.raises(ServiceUnreachableError):
        gone.reserve("s", "alpha/small")
