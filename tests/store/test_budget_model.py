"""R-RES-1..8, R-RES-11, R-DB-3b, R-POL-9: the ledger agrees with a tiny in-memory model of
the budget rules.

A hypothesis state machine runs random reserve / settle / clock moves (forwards and backwards)
against a real SQLite ledger and a plain-Python reference; every reservation, refusal reason,
retry time, deadline, estimate and stored cost must match. The reference also keeps the recovery
probes its failures' cooldowns arm (R-POL-9, R-POL-10), which decide `probing` refusals and the
escalated cooldowns. Plus the cost property: the estimate is never below the actual cost when
the provider respected max tokens.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ledger.api import Ledger
from ledger.budgets import checks as budgets
from ledger.catalog import Catalog, Model, PriceTier
from ledger.classify import classify_kind
from ledger.config import Policy
from ledger.errors import Refused, UsageError
from ledger.records import Cancelled, Failed, Success
from ledger.store import sqlite_driver
from tests.support.ledgers import T0, TEST_CATALOG, Clock

MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000
CATALOG = Catalog.model_validate(TEST_CATALOG)
POLICY = Policy.model_validate(
    {"callsPerHour": 4, "sourceCalls": 3, "sourceModels": 2, "timeoutMs": 60_000,
     "sourceTimeMs": 150_000, "dailyEstimatedUsd": 0.05, "replyTokens": 1000}
)
CEILING = 50_000  # micro-USD
SOURCES = ("s0", "s1", "s2")
MODELS = ("alpha/small", "alpha/big", "beta/mid", "beta/free/unknown", "gamma/g1")
SIZES = (0, 1, 999, 3000, 5000)
BACKOFF = (1 * MIN, 5 * MIN, 15 * MIN, 1 * HOUR)  # R-POL-3 (jitter pinned to 0)
# clock moves, some exactly at window edges, some backwards (R-DB-3b)
STEPS = (1, 999, 30_000, 59_999, 60_001, 10 * MIN, HOUR - 1, HOUR, 3 * HOUR, DAY, -HOUR, -5 * MIN)


def ref_estimate(model: Model, size: int) -> int | None:
    """Input bytes x highest input price + reply reservation x highest output price (R-RES-2)."""
    tiers = model.pricing or []
    if not tiers or any(t.input_usd_per_mtok is None or t.output_usd_per_mtok is None
                        for t in tiers):
        return None
    top_in = max(Decimal(str(t.input_usd_per_mtok)) for t in tiers)
    top_out = max(Decimal(str(t.output_usd_per_mtok)) for t in tiers)
    reply = min(model.max_output_tokens or POLICY.reply_tokens, POLICY.reply_tokens)
    return math.ceil(size * top_in + reply * top_out)


def ref_actual(model: Model, tokens_in: int, tokens_out: int) -> int | None:
    """Reported usage at the tier the input falls in."""
    if ref_estimate(model, 0) is None:
        return None
    for tier in model.pricing or []:
        if tier.up_to_input_tokens is None or tokens_in <= tier.up_to_input_tokens:
            return math.ceil(tokens_in * Decimal(str(tier.input_usd_per_mtok))
                             + tokens_out * Decimal(str(tier.output_usd_per_mtok)))
    raise AssertionError("the last tier has no bound")


@dataclass
class RefReservation:
    id: int
    source: str
    model: Model
    created: int
    deadline: int
    size: int
    estimate: int | None
    cost: int | None
    settled_at: int | None = None


@dataclass
class RefSource:
    done: bool = False
    paused: bool = False
    retry_at: int | None = None
    failures: int = 0
    output_failures: int = 0
    backoff_steps: int = 0
    models: set[str] = field(default_factory=set)


@dataclass
class RefProbe:
    """R-POL-9: a target armed by a policy cooldown; its probe holder and failed-probe streak."""

    holder: int | None = None
    deadline: int | None = None
    claimed: int = 0
    streak: int = 0


BASE_COOLDOWN = {"auth": 15 * MIN, "rate_limit": MIN}  # R-POL-10: doubled per failed probe, 4x cap


@cache
def template_db() -> bytes:
    """A database built once by the migrations; each example starts from a copy."""
    with tempfile.TemporaryDirectory() as tmp:
        Ledger.open(tmp, policy=POLICY, catalog=CATALOG, env={}).close()
        return (Path(tmp) / "ledger.db").read_bytes()


class BudgetMachine(RuleBasedStateMachine):
    """Random reserve / settle / clock moves against the ledger and the reference model."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-model-"))
        (self.dir / "ledger.db").write_bytes(template_db())
        (self.dir / "ledger.db").chmod(0o600)
        self.wall = Clock(T0)
        self.led = Ledger.open(self.dir, policy=POLICY, catalog=CATALOG, env={},
                               clock=self.wall, jitter=lambda: 0.0)
        self.newest = 0  # the newest time the ledger stored (R-DB-3b)
        self.rows: list[RefReservation] = []
        self.sources: dict[str, RefSource] = {}
        self.cooldowns: dict[str, int] = {}  # provider or model key -> until
        self.probes: dict[str, RefProbe] = {}  # provider or model key -> its armed probe

    def teardown(self) -> None:
        self.led.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _tick(self) -> int:
        """Ledger time inside a committed write transaction."""
        self.newest = max(self.newest, self.wall.ms)
        return self.newest

    # --- reference decision ----------------------------------------------------------------

    def _expected(self, now: int, source: str, model: Model, size: int
                  ) -> tuple[str, int | None] | tuple[None, int]:
        hour = sorted(r.created for r in self.rows if r.created > now - HOUR)
        if len(hour) >= POLICY.calls_per_hour:
            return "shared_hourly_budget", hour[len(hour) - POLICY.calls_per_hour] + HOUR
        estimate = ref_estimate(model, size)
        if estimate is None:
            return "unknown_price", None
        day = [r for r in self.rows if r.created > now - DAY]
        excess = sum(r.cost or 0 for r in day) + estimate - CEILING
        if excess > 0:  # retry when enough of the window's cost has left it (issue 12 item 15)
            when: int | None = None
            for r in sorted(day, key=lambda r: (r.created, r.id)):
                excess -= r.cost or 0
                if estimate <= CEILING and excess <= 0:
                    when = r.created + DAY
                    break
            return "daily_cost_ceiling", when
        src = self.sources.setdefault(source, RefSource())
        if src.done:
            return "source_settled", None
        if src.paused:
            return "source_paused", None
        if src.retry_at is not None and src.retry_at > now:
            return "source_backoff", src.retry_at
        for scope, key in (("provider_cooldown", model.provider), ("model_cooldown", model.key)):
            if self.cooldowns.get(key, 0) > now:
                return scope, self.cooldowns[key]
        held = [
            probe.deadline
            for key in (model.provider, model.key)
            if (probe := self.probes.get(key)) is not None
            and probe.deadline is not None
            and probe.deadline > now
        ]
        if held:  # R-POL-9: another reservation is the probe until its deadline
            return "probing", max(held)
        mine = [r for r in self.rows if r.source == source]
        if len(mine) >= POLICY.source_calls:
            return "source_calls", None
        if model.key not in src.models and len(src.models) + 1 > POLICY.source_models:
            return "source_models", None
        used = sum(r.deadline - r.created if r.settled_at is None
                   else max(0, r.settled_at - r.created) for r in mine)
        left = POLICY.source_time_ms - used
        if left <= 0:
            return "source_time", None
        return None, now + min(POLICY.timeout_ms, left)

    # --- rules ---------------------------------------------------------------------------

    @rule(source=st.sampled_from(SOURCES), key=st.sampled_from(MODELS),
          size=st.sampled_from(SIZES))
    def reserve(self, source: str, key: str, size: int) -> None:
        model = CATALOG.require_model(key)
        now = self._tick()
        reason, when = self._expected(now, source, model, size)
        self.sources.setdefault(source, RefSource())
        if reason is not None:
            with pytest.raises(Refused) as info:
                self.led.reserve(source, key, input_bytes=size)
            assert (info.value.reason, info.value.retry_at_ms) == (reason, when)
            return
        res = self.led.reserve(source, key, input_bytes=size)
        estimate = ref_estimate(model, size)
        assert (res.created_ms, res.deadline_ms, res.estimate_micro) == (now, when, estimate)
        assert res.id == len(self.rows) + 1
        assert when is not None
        self.rows.append(RefReservation(res.id, source, model, now, when, size, estimate, estimate))
        self.sources[source].models.add(key)
        for target in (model.provider, model.key):  # the first grant after a cooldown probes it
            probe = self.probes.get(target)
            if probe is not None and (probe.deadline is None or probe.deadline <= now):
                probe.holder, probe.deadline, probe.claimed = res.id, when, now

    def _held(self, row: RefReservation) -> dict[str, RefProbe]:
        """The targets this reservation is the probe of."""
        return {
            target: probe
            for target, probe in self.probes.items()
            if probe.holder == row.id and probe.deadline == row.deadline
        }

    def _probe_answered(self, held: dict[str, RefProbe]) -> None:
        """The probe showed its targets answer: probing ends, unless a cooldown set while it
        was in flight ends in a probe of its own."""
        for target, probe in held.items():
            if self.cooldowns.get(target, 0) > probe.claimed:
                probe.holder, probe.deadline, probe.streak = None, None, 0
            else:
                del self.probes[target]

    @staticmethod
    def _probe_freed(held: dict[str, RefProbe]) -> None:
        for probe in held.values():
            probe.holder, probe.deadline = None, None

    def _pick(self, index: int) -> RefReservation:
        return self.rows[index % len(self.rows)]

    def _settle_again_refused(self, row: RefReservation) -> bool:
        if row.settled_at is None:
            return False
        with pytest.raises(UsageError):
            self.led.settle(row.id, Cancelled())
        return True

    @precondition(lambda self: self.rows)
    @rule(index=st.integers(0, 100), f_in=st.floats(0, 1), f_out=st.floats(0, 1),
          finish=st.booleans())
    def settle_success(self, index: int, f_in: float, f_out: float, finish: bool) -> None:
        row = self._pick(index)
        if self._settle_again_refused(row):
            return
        now = self._tick()
        self._probe_answered(self._held(row))
        reply = min(row.model.max_output_tokens or POLICY.reply_tokens, POLICY.reply_tokens)
        tokens_in, tokens_out = int(row.size * f_in), int(reply * f_out)
        result = self.led.settle(row.id, Success(tokens_in, tokens_out, finish=finish))
        actual = ref_actual(row.model, tokens_in, tokens_out)
        if actual is not None and row.estimate is not None:
            assert actual <= row.estimate  # the provider respected max tokens
        row.cost = actual if actual is not None else row.estimate
        row.settled_at = now
        late = now > row.deadline
        assert (result.late, result.must_not_commit, result.cost_micro) == (late, late, row.cost)
        assert result.finished == (finish and not late)
        if finish and not late:
            self.sources[row.source].done = True

    @precondition(lambda self: self.rows)
    @rule(index=st.integers(0, 100))
    def settle_without_usage(self, index: int) -> None:
        row = self._pick(index)
        if self._settle_again_refused(row):
            return
        row.settled_at = self._tick()
        self._probe_answered(self._held(row))
        assert self.led.settle(row.id, Success()).cost_micro == row.estimate

    @precondition(lambda self: self.rows)
    @rule(index=st.integers(0, 100))
    def settle_cancelled(self, index: int) -> None:
        row = self._pick(index)
        if self._settle_again_refused(row):
            return
        row.settled_at = self._tick()
        self._probe_freed(self._held(row))
        result = self.led.settle(row.id, Cancelled())
        assert result.cost_micro == row.estimate  # a cancelled call is not assumed free

    @precondition(lambda self: self.rows)
    @rule(index=st.integers(0, 100),
          kind=st.sampled_from(["auth", "rate_limit", "unknown", "invalid_output"]))
    def settle_failed(self, index: int, kind: str) -> None:
        row = self._pick(index)
        if self._settle_again_refused(row):
            return
        now = row.settled_at = self._tick()
        result = self.led.settle(row.id, Failed(classify_kind(kind)))
        assert result.cost_micro == row.estimate
        src = self.sources[row.source]
        src.failures += 1
        held = self._held(row)
        if kind in BASE_COOLDOWN:  # auth cools the provider, rate_limit the model (R-POL-10)
            target = row.model.provider if kind == "auth" else row.model.key
            base = BASE_COOLDOWN[kind]
            probe = held.get(target)
            cooldown = base if probe is None else min(base << (probe.streak + 1), 4 * base)
            self.cooldowns[target] = max(self.cooldowns.get(target, 0), now + cooldown)
            for other, their in held.items():
                if other == target:  # a failed probe
                    their.holder, their.deadline, their.streak = None, None, their.streak + 1
                else:
                    their.holder, their.deadline = None, None
            self.probes.setdefault(target, RefProbe())
        elif kind == "unknown":  # no cooldown: a probe it held is freed for the next
            self._probe_freed(held)
            src.retry_at = now + BACKOFF[min(src.backoff_steps, len(BACKOFF) - 1)]
            src.backoff_steps += 1
        if kind == "invalid_output":  # the target answered: a probe succeeded
            self._probe_answered(held)
            src.output_failures += 1
        if src.output_failures >= 3 or src.failures >= 5:
            src.paused = True
        assert (result.paused is not None) == src.paused

    @rule(step=st.sampled_from(STEPS))
    def move_clock(self, step: int) -> None:
        self.wall.advance(step)

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def stored_rows_match(self) -> None:
        with sqlite_driver.connect(self.dir / "ledger.db") as conn:
            stored = conn.execute(
                "SELECT id, created_ms, cost_micro, settled_ms FROM reservations ORDER BY id"
            ).fetchall()
            newest = conn.execute("SELECT newest_ms FROM clock").fetchall()
        expected = [(r.id, r.created, r.cost, r.settled_at) for r in self.rows]
        assert stored == expected  # no reservation lost, none extra, every cost as modelled
        assert newest == ([(self.newest,)] if self.newest else [])


BudgetMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_r_res_budgets_match_reference_model = BudgetMachine.TestCase


@st.composite
def priced_models(draw: st.DrawFn) -> Model:
    """A catalog model with 1-3 ordered price tiers and maybe a max output ceiling."""
    count = draw(st.integers(1, 3))
    bounds = sorted(draw(st.sets(st.integers(1, 10**7), min_size=count - 1, max_size=count - 1)))
    # positive: a billed model's zero price is unknown, not free (issue 12 item 11)
    price = st.floats(0.0001, 1000, allow_nan=False).map(lambda p: max(round(p, 4), 0.0001))
    tiers = [
        PriceTier(up_to_input_tokens=bound, input_usd_per_mtok=draw(price),
                  output_usd_per_mtok=draw(price))
        for bound in [*bounds, None]
    ]
    max_out = draw(st.none() | st.integers(1, 200_000))
    return Model(provider="p", id="m", max_output_tokens=max_out, pricing=tiers)


@given(model=priced_models(), size=st.integers(0, 10**8), reply=st.integers(1, 200_000),
       data=st.data())
@settings(max_examples=300, deadline=None)
def test_r_res_2_estimate_never_below_actual_when_max_tokens_respected(
    model: Model, size: int, reply: int, data: st.DataObject
) -> None:
    allowance = model.reply_reservation(reply)
    tokens_in = data.draw(st.integers(0, size))  # a token is at least one byte
    tokens_out = data.draw(st.integers(0, allowance))  # the reply reservation is sent as max tokens
    estimate = budgets.estimate_micro(model, size, reply)
    actual = budgets.actual_micro(model, tokens_in, tokens_out)
    assert estimate is not None
    assert actual is not None
    assert actual <= estimate
