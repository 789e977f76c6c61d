"""Health per provider and per model (R-DIAG-6): pure, over rows status reads in one transaction.

A target is `cooling` while a cooldown on it runs, `probing` once a policy or hint cooldown ended
until a recovery probe on it succeeds (R-POL-9), `failing` when neither but its last attempt
failed (consecutive failures >= 1 since its last success: "healthy" beside "3 failures in a row"
contradicted itself, issue 33), else `healthy`. Nothing here reads the clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ledger.clock import iso
from ledger.kinds import CooldownScope


class HealthState(StrEnum):
    """Where a provider or model stands."""

    HEALTHY = "healthy"
    COOLING = "cooling"
    PROBING = "probing"
    FAILING = "failing"


@dataclass(frozen=True)
class HealthCounters:
    """The stored counters of one target (store/health.py)."""

    scope: CooldownScope
    target: str
    consecutive_failures: int
    last_failure_kind: str | None
    last_failure_ms: int | None
    last_success_ms: int | None


@dataclass(frozen=True)
class ProbeState:
    """A target armed for a recovery probe, with its failed-probe streak and probe in flight."""

    scope: CooldownScope
    target: str
    streak: int
    holder_deadline_ms: int | None


@dataclass(frozen=True)
class HourCount:
    """Attempts created on one model in the last hour, and how many failed."""

    provider: str
    model_key: str
    attempts: int
    failures: int


@dataclass(frozen=True)
class Health:
    """One row of the health view."""

    scope: CooldownScope
    target: str
    state: HealthState
    cooling_until_ms: int | None
    probe_in_flight_until_ms: int | None
    consecutive_failures: int
    last_failure_kind: str | None
    last_failure_ms: int | None
    last_success_ms: int | None
    attempts_1h: int
    failures_1h: int
    probe_streak: int

    def to_json(self) -> dict[str, Any]:
        """The documented JSON shape (`status --json` -> `health`)."""
        return {
            "scope": self.scope.value,
            "target": self.target,
            "state": self.state.value,
            "cooling_until": iso(self.cooling_until_ms),
            "probe_until": iso(self.probe_in_flight_until_ms),
            "consecutive_failures": self.consecutive_failures,
            "last_failure_kind": self.last_failure_kind,
            "last_failure_at": iso(self.last_failure_ms),
            "last_success_at": iso(self.last_success_ms),
            "attempts_1h": self.attempts_1h,
            "failures_1h": self.failures_1h,
            "probe_streak": self.probe_streak,
        }


Key = tuple[CooldownScope, str]


def health_view(
    now_ms: int,
    cooling: Iterable[tuple[CooldownScope, str, int]],
    probes: Iterable[ProbeState],
    counters: Iterable[HealthCounters],
    hour: Iterable[HourCount],
) -> list[Health]:
    """Every provider and model with a cooldown, a probe, stored counters or last-hour attempts,
    providers first, then by name."""
    ends: dict[Key, int] = {}
    for scope, target, until in cooling:
        if until > now_ms:
            ends[scope, target] = max(until, ends.get((scope, target), until))
    armed = {(p.scope, p.target): p for p in probes}
    stored = {(c.scope, c.target): c for c in counters}
    per_hour: dict[Key, list[int]] = {}
    for h in hour:
        for key in ((CooldownScope.PROVIDER, h.provider), (CooldownScope.MODEL, h.model_key)):
            total = per_hour.setdefault(key, [0, 0])
            total[0] += h.attempts
            total[1] += h.failures
    keys = sorted(
        set(ends) | set(armed) | set(stored) | set(per_hour),
        key=lambda k: (k[0] != CooldownScope.PROVIDER, k[1]),
    )
    rows = []
    for key in keys:
        probe, count = armed.get(key), stored.get(key)
        in_flight = probe.holder_deadline_ms if probe is not None else None
        if in_flight is not None and in_flight <= now_ms:
            in_flight = None  # its worker died: the next reservation probes
        state = HealthState.HEALTHY
        if key in ends:
            state = HealthState.COOLING
        elif probe is not None:
            state = HealthState.PROBING
        elif count is not None and count.consecutive_failures > 0:
            state = HealthState.FAILING
        attempts, failures = per_hour.get(key, (0, 0))
        rows.append(
            Health(
                scope=key[0],
                target=key[1],
                state=state,
                cooling_until_ms=ends.get(key),
                probe_in_flight_until_ms=in_flight if state is HealthState.PROBING else None,
                consecutive_failures=count.consecutive_failures if count else 0,
                last_failure_kind=count.last_failure_kind if count else None,
                last_failure_ms=count.last_failure_ms if count else None,
                last_success_ms=count.last_success_ms if count else None,
                attempts_1h=attempts,
                failures_1h=failures,
                probe_streak=probe.streak if probe is not None else 0,
            )
        )
    return rows
