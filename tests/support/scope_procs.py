"""Child processes of the scope burst tests (R-SC-1): top-level targets for spawn children.

Invariant (as support/procs.py): a child only reports what it was granted and refused; the parent
alone checks the database and decides pass/fail. Each child reserves through one of the three
ways a job can: the library on the shared ledger, `LedgerClient` through a real `ledger serve`,
or the `ledger reserve` command in a subprocess of its own per call.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

from ledger.api import Ledger
from ledger.client import LedgerClient
from ledger.errors import LedgerError, Refused
from ledger.records import Cancelled, Success
from tests.support.procs import BarrierLike, QueueLike, reserver

MODEL = "alpha/small"


def burst_child(
    how: str,
    target: str,
    db: str | None,
    tag: int,
    attempts: int,
    scopes: list[str],
    barrier: BarrierLike,
    out: QueueLike,
) -> None:
    """Reserve `attempts` times on distinct sources under `scopes` once all are ready.

    `how`: "library" (target: the state directory), "client" (target: the service's socket) or
    "cli" (target: the state directory). Reports granted (id, estimate) pairs and refusal codes.
    """
    granted: list[tuple[int, int | None]] = []
    refused: Counter[str] = Counter()
    errors: list[str] = []
    try:
        reserve = _reserver(how, target, db)
        barrier.wait(timeout=300)
        for i in range(attempts):
            try:
                res = reserve(f"burst-{how}-{tag}-{i}", scopes)
                if res is not None:
                    granted.append(res)
            except Refused as refusal:
                refused[refusal.reason] += 1
            except LedgerError as error:
                errors.append(f"{type(error).__name__}: {error.message}")
    except Exception as error:  # reported, never swallowed: the parent asserts there are none
        errors.append(f"{type(error).__name__}: {error}")
    out.put({"how": how, "tag": tag, "granted": granted, "refused": dict(refused),
             "errors": errors})


def _reserver(how: str, target: str, db: str | None) -> Any:
    """A function (source, scopes) -> (id, estimate), raising Refused for a refusal."""
    reserve = reserver(how, target, db)

    def on_model(source: str, scopes: list[str]) -> tuple[int, int | None]:
        rid, micro, _ = reserve(source, MODEL, 0, scopes)
        return rid, micro

    return on_model


def in_flight_child(
    how: str,
    target: str,
    db: str | None,
    tag: int,
    grants: int,
    barrier: BarrierLike,
    out: QueueLike,
) -> None:
    """Take `grants` reservations under the `slots` scope, one at a time: hold each a little,
    then settle it (or, every fifth, leave it to expire at its deadline); a refusal waits a
    moment and tries again. Reports the ids granted and the refusal codes seen."""
    rng = random.Random(tag)
    granted: list[int] = []
    refused: Counter[str] = Counter()
    errors: list[str] = []
    try:
        if how == "library":
            api: Any = Ledger.open(target, db, env={})
        else:
            api = LedgerClient(target, home=target)
        barrier.wait(timeout=300)
        tries = 0
        while len(granted) < grants and tries < 20 * grants + 400:
            tries += 1
            try:
                res = api.reserve(f"slot-{how}-{tag}-{tries}", MODEL, scopes=["slots"])
            except Refused as refusal:
                refused[refusal.reason] += 1
                time.sleep(rng.uniform(0.001, 0.01))
                continue
            granted.append(res.id)
            time.sleep(rng.uniform(0.0, 0.02))  # the "call"
            if len(granted) % 5 == 0:
                continue  # left open: it expires at its deadline, which frees its slot
            if rng.random() < 0.5:
                api.settle(res.id, Success(input_tokens=1, output_tokens=1))
            else:
                api.settle(res.id, Cancelled())
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
    out.put({"how": how, "tag": tag, "granted": granted, "refused": dict(refused),
             "errors": errors})
