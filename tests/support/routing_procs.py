"""Child-process targets for the routing fleet tests (top level, for spawn children).

A child only reports what it saw (granted models, refusal codes, error names); the parent alone
checks the database.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ledger.api import Ledger
from ledger.errors import LedgerError, Refused
from tests.support.procs import BarrierLike, QueueLike


def pool_racer(
    home: str,
    barrier: BarrierLike,
    tag: int,
    attempts: int,
    model: str,
    out: QueueLike,
    db: str | None = None,
) -> None:
    """Reserve `attempts` times through `model` (a pool key) on distinct sources."""
    granted: list[tuple[int, str]] = []
    refused: Counter[str] = Counter()
    errors: list[str] = []
    try:
        led = Ledger.open(home, db, env={})
        barrier.wait(timeout=120)
        for i in range(attempts):
            try:
                res = led.reserve(f"fleet-{tag}-{i}", model, input_bytes=100)
                granted.append((res.id, res.model))
            except Refused as refusal:
                refused[refusal.reason] += 1
            except LedgerError as error:
                errors.append(type(error).__name__)
        led.close()
    except Exception as error:  # reported, never swallowed
        errors.append(f"{type(error).__name__}: {error}")
    report: dict[str, Any] = {"granted": granted, "refused": dict(refused), "errors": errors}
    out.put(report)


def client_pool_racer(
    socket: str,
    barrier: BarrierLike,
    tag: int,
    attempts: int,
    model: str,
    out: QueueLike,
) -> None:
    """As `pool_racer`, through a running `ledger serve` (LedgerClient over its socket)."""
    from ledger.client import LedgerClient

    granted: list[tuple[int, str]] = []
    refused: Counter[str] = Counter()
    errors: list[str] = []
    try:
        with LedgerClient(socket) as client:
            barrier.wait(timeout=120)
            for i in range(attempts):
                try:
                    res = client.reserve(f"svc-{tag}-{i}", model, input_bytes=100)
                    granted.append((res.id, res.model))
                except Refused as refusal:
                    refused[refusal.reason] += 1
                except LedgerError as error:
                    errors.append(type(error).__name__)
    except Exception as error:  # reported, never swallowed
        errors.append(f"{type(error).__name__}: {error}")
    out.put({"granted": granted, "refused": dict(refused), "errors": errors})
