"""Child-process helpers for the reliability tests: top-level targets for spawn/forkserver children.

Invariant: a child only reports what it saw (granted reservation ids, refusal codes, error class
names, acknowledgements) to the parent; the parent alone checks the database and decides pass/fail.
Every child opens its own `Ledger` on the shared state directory, exactly like a worker process.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from ledger.api import Ledger
from ledger.classify import classify_kind
from ledger.client import LedgerClient
from ledger.errors import LedgerError, Refused
from ledger.records import Cancelled, Failed, Outcome, Reservation, Success
from ledger.store import Store, reads
from ledger.store.reservations import ReserveRequest

# A separate process holding the SQLite write lock until its stdin closes (fault tests).
HOLD_WRITE_LOCK = (
    "import sys\n"
    "from ledger.store import sqlite_driver\n"
    "c = sqlite_driver.connect(sys.argv[1], isolation_level=None)\n"
    "c.execute('BEGIN IMMEDIATE')\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"
    "c.execute('ROLLBACK')\n"
)


@contextmanager
def write_lock_held(db: Path) -> Iterator[None]:
    """Another process holds BEGIN IMMEDIATE on the database until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_WRITE_LOCK, str(db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.communicate("", timeout=60)


class BarrierLike(Protocol):
    """The part of multiprocessing.Barrier the children use."""

    def wait(self, timeout: float | None = None) -> int: ...


class QueueLike(Protocol):
    """The part of multiprocessing.Queue the children use."""

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None: ...


class Frozen:
    """The ledger's clock, stopped at one millisecond (picklable for spawned children)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def race(
    target: Callable[..., None],
    count: int,
    args: Callable[[int, BarrierLike, QueueLike], tuple[Any, ...]],
    timeout_s: float = 180,
) -> list[dict[str, Any]]:
    """Spawn `count` processes running `target(*args(tag, barrier, out))`, all released by one
    barrier; every child's report (one each, put on `out`), once each has exited 0."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(count)
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=args(tag, barrier, out)) for tag in range(count)]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = [out.get(timeout=timeout_s) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return reports


def write_home(home: Path, catalog: dict[str, Any], **policy: Any) -> None:
    """Write catalog.json and recovery.json into a state directory (children read them at start)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "catalog.json").write_text(json.dumps(catalog))
    (home / "recovery.json").write_text(json.dumps(policy))


def open_ledger(home: str, db: str | None = None) -> Ledger:
    """Open the ledger as a worker would: policy and catalog from the state directory, the
    database from `--db` when given (the PostgreSQL contract cases), else ledger.db."""
    return Ledger.open(home, db, env={})


def cli_argv(home: str, db: str | None, *args: str) -> list[str]:
    """`python -m ledger --home HOME [--db DB] ARGS…` as an operator would run it."""
    argv = [sys.executable, "-m", "ledger", "--home", home]
    if db is not None:
        argv += ["--db", db]
    return [*argv, *args]


Reserve = Callable[[str, str, int, Sequence[str]], tuple[int, int | None, int | None]]


def reserver(how: str, target: str, db: str | None) -> Reserve:
    """A function (source, model, input_bytes, scopes) -> (id, estimate_micro, estimate_tokens)
    raising `Refused` (its message carries the refusal's detail), through one of the three ways
    a job reserves: "library" (target: the state directory), "client" (`LedgerClient` on a
    service; target: its socket) or "cli" (`ledger reserve --json`, a process per call; target:
    the state directory)."""
    if how == "library":
        led = Ledger.open(target, db, env={})

        def by_library(source: str, model: str, size: int, scopes: Sequence[str]) -> Any:
            return _triple(led.reserve(source, model, input_bytes=size, scopes=scopes))

        return by_library
    if how == "client":
        client = LedgerClient(target, home=target)

        def by_client(source: str, model: str, size: int, scopes: Sequence[str]) -> Any:
            return _triple(client.reserve(source, model, input_bytes=size, scopes=scopes))

        return by_client

    def by_cli(source: str, model: str, size: int, scopes: Sequence[str]) -> Any:
        argv = cli_argv(target, db, "reserve", source, "--model", model, "--input-bytes",
                        str(size), "--json")  # fmt: skip
        for scope in scopes:
            argv += ["--scope", scope]
        done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ))
        doc = json.loads(done.stdout)
        if done.returncode == 3:
            raise Refused(doc["error"]["code"], doc["error"]["message"])
        if done.returncode != 0:
            raise LedgerError(f"exit {done.returncode}")
        return int(doc["id"]), None, doc.get("estimate_tokens")

    return by_cli


def _triple(res: Reservation) -> tuple[int, int | None, int | None]:
    return res.id, res.estimate_micro, res.estimate_tokens


def planned_racer(
    how: str,
    target: str,
    db: str | None,
    tag: int,
    plan: Sequence[tuple[str, int, Sequence[str]]],
    barrier: BarrierLike,
    out: QueueLike,
) -> None:
    """Reserve each planned (model, input bytes, scopes) once every racer is ready, through
    `how` (see `reserver`). Reports granted ids by plan index and each refusal's plan index,
    reason and message."""
    granted: list[tuple[int, int]] = []
    refused: list[tuple[int, str, str]] = []
    errors: list[str] = []
    try:
        reserve = reserver(how, target, db)
        barrier.wait(timeout=300)
        for i, (model, size, scopes) in enumerate(plan):
            try:
                granted.append((i, reserve(f"race-{how}-{tag}-{i}", model, size, scopes)[0]))
            except Refused as refusal:
                refused.append((i, refusal.reason, refusal.message))
            except LedgerError as error:
                errors.append(f"{type(error).__name__}: {error.message}")
    except Exception as error:  # reported, never swallowed: the parent asserts there are none
        errors.append(f"{type(error).__name__}: {error}")
    out.put({"how": how, "tag": tag, "granted": granted, "refused": refused, "errors": errors})


def break_transaction_scope(delay_s: float) -> None:
    """Deliberately violate R-DB-2 in this process: check the hourly count in one transaction,
    sleep, then insert in another (the write transaction trusts the stale count)."""
    original = Store.reserve
    real_state = reads.shared_state

    def stale_reserve(self: Store, policy: Any, request: ReserveRequest, fp: str) -> Any:
        model = request.model
        with self.db.read() as conn:
            now = self.db.read_now(conn)
            stale, _ = real_state(conn, now, policy.calls_per_hour, model.provider, model.key)
        time.sleep(delay_s)

        def stale_hour(
            conn: Any, now: int, calls_per_hour: int, provider: str, model_key: str,
            also: Any = None,
        ) -> tuple[reads.SharedState, tuple[Any, ...]]:
            fresh, more = real_state(conn, now, calls_per_hour, provider, model_key, also)
            stale_state = dataclasses.replace(
                fresh, hourly=stale.hourly, hourly_next_free_ms=stale.hourly_next_free_ms
            )
            return stale_state, more

        reads.shared_state = stale_hour
        try:
            return original(self, policy, request, fp)
        finally:
            reads.shared_state = real_state

    setattr(Store, "reserve", stale_reserve)  # noqa: B010 - patching a method on purpose


def race_worker(
    home: str,
    barrier: BarrierLike,
    tag: int,
    attempts: int,
    broken: bool,
    out: QueueLike,
    db: str | None = None,
) -> None:
    """Reserve `attempts` times on distinct sources once every racer is ready; report the result."""
    granted: list[int] = []
    refused: Counter[str] = Counter()
    errors: list[str] = []
    try:
        if broken:
            break_transaction_scope(0.02)
        led = open_ledger(home, db)
        barrier.wait(timeout=120)
        for i in range(attempts):
            try:
                granted.append(led.reserve(f"race-{tag}-{i}", "alpha/small", input_bytes=100).id)
            except Refused as refusal:
                refused[refusal.reason] += 1
            except LedgerError as error:
                errors.append(type(error).__name__)
        led.close()
    except Exception as error:  # reported, never swallowed: the parent asserts there are none
        errors.append(f"{type(error).__name__}: {error}")
    out.put({"tag": tag, "granted": granted, "refused": dict(refused), "errors": errors})


def _random_outcome(
    rng: random.Random, input_bytes: int, reply_tokens: int, failures: bool = True
) -> Outcome:
    roll = rng.random() if failures else rng.random() * 0.8
    if roll < 0.5:  # a provider that respected max tokens: actual <= estimate
        return Success(
            input_tokens=rng.randint(0, input_bytes),
            output_tokens=rng.randint(0, reply_tokens),
        )
    if roll < 0.6:
        return Success()  # usage unknown: the estimate keeps counting
    if roll < 0.8:
        return Cancelled()
    return Failed(classify_kind(rng.choice(["unknown", "invalid_output", "stale"])))


def contention_worker(
    home: str,
    barrier: BarrierLike,
    seed: int,
    operations: int,
    sources: list[str],
    models: list[str],
    out: QueueLike,
    db: str | None = None,
) -> None:
    """Mix reserves and settles (some immediate, some later) over shared sources and models."""
    rng = random.Random(seed)
    granted: list[tuple[int, str, str]] = []
    refused: Counter[str] = Counter()
    errors: list[str] = []
    settled = 0
    try:
        led = open_ledger(home, db)
        reply = led.policy.reply_tokens
        open_ids: list[tuple[int, int]] = []
        barrier.wait(timeout=120)
        for _ in range(operations):
            if open_ids and rng.random() < 0.4:
                rid, size = open_ids.pop(rng.randrange(len(open_ids)))
                try:
                    led.settle(rid, _random_outcome(rng, size, reply))
                    settled += 1
                except LedgerError as error:
                    errors.append(type(error).__name__)
                continue
            source, model = rng.choice(sources), rng.choice(models)
            size = rng.choice([0, 1000, 20_000])
            try:
                res = led.reserve(source, model, input_bytes=size)
            except Refused as refusal:
                refused[refusal.reason] += 1
                continue
            except LedgerError as error:
                errors.append(type(error).__name__)
                continue
            granted.append((res.id, source, model))
            open_ids.append((res.id, size))
        led.close()
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
    out.put({"seed": seed, "granted": granted, "refused": dict(refused), "errors": errors,
             "settled": settled})


def crash_child(home: str, round_no: int, acks: Connection, db: str | None = None) -> None:
    """Reserve and settle forever with request ids, acknowledging each commit; killed by the parent.

    Messages: ("intent", request_id, source, model) before a reserve, ("reserved", request_id,
    id) after its commit, ("settled", id) after a settle commits; each is one small pipe write.
    """
    led = open_ledger(home, db)
    rng = random.Random(round_no)
    models = ("alpha/small", "beta/mid")
    i = 0
    while True:
        request_id = f"crash-{round_no}-{i}"
        model = models[i % 2]
        source = f"crash-src-{round_no}-{i}"
        acks.send(("intent", request_id, source, model))
        res = led.reserve(source, model, input_bytes=rng.randint(0, 5000), request_id=request_id)
        time.sleep(rng.random() * 0.005)  # a worker slow to acknowledge widens the crash window
        acks.send(("reserved", request_id, res.id))
        led.settle(res.id, _random_outcome(rng, 100, 100, failures=False))
        acks.send(("settled", res.id))
        i += 1


def dying_commit_handler(job: Any) -> Any:
    """`worker run --handler` target: a good result whose commit kills the process (exit 9)."""
    import os

    from ledger.worker.queue import HandlerResult

    response = job.call([])

    def commit() -> None:
        os._exit(9)

    return HandlerResult.success(response, commit=commit)


def failing_commit_handler(job: Any) -> Any:
    """`worker run --handler` target: a good result whose commit always raises (its store is
    down), so the worker must count a failure and back off instead of calling again."""
    from ledger.worker.queue import HandlerResult

    response = job.call([])

    def commit() -> None:
        raise OSError("the handler's own store is down")

    return HandlerResult.success(response, commit=commit)


SLOW_COMMIT_S = 3.0


def slow_commit_handler(job: Any) -> Any:
    """`worker run --handler` target: a good result whose commit takes SLOW_COMMIT_S seconds.

    The commit appends "start <source>" to $LEDGER_TEST_LOG when it begins and "<source>" when it
    ends, so the parent sees a commit in progress and counts the finished ones.
    """
    import os

    from ledger.providers.base import Message
    from ledger.worker.queue import HandlerResult

    response = job.call([Message("user", job.payload_ref or job.source_id)])
    path = os.environ["LEDGER_TEST_LOG"]

    def append(line: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{line}\n".encode())
        finally:
            os.close(fd)

    def commit() -> None:
        append(f"start {job.source_id}")
        time.sleep(SLOW_COMMIT_S)
        append(job.source_id)

    return HandlerResult.success(response, commit=commit)


def probe_racer(
    home: str, barrier: BarrierLike, tag: int, out: QueueLike, db: str | None = None
) -> None:
    """Reserve the model whose cooldown just ended, then a backup, all at once (R-POL-9)."""
    granted: list[str] = []
    refused: Counter[str] = Counter()
    errors: list[str] = []
    try:
        led = open_ledger(home, db)
        barrier.wait(timeout=120)
        for model in ("alpha/small", "beta/mid"):
            try:
                led.reserve(f"herd-{tag}-{model}", model, input_bytes=100)
                granted.append(model)
            except Refused as refusal:
                refused[refusal.reason] += 1
        led.close()
    except Exception as error:  # reported, never swallowed: the parent asserts there are none
        errors.append(f"{type(error).__name__}: {error}")
    out.put({"tag": tag, "granted": granted, "refused": dict(refused), "errors": errors})
