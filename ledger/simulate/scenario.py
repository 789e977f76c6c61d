"""Scenario files (R-SIM-2): provider behaviour and source arrivals described instead of recorded.

A scenario names a start time and a span; typical latency and token sizes (per provider or model
under `targets`); windows of behaviour per provider or model (`anthropic` answers 529 with
probability 0.3 from 10:00 to 10:40; `openai/gpt-4.1` answers 429 with Retry-After 30 for 20
minutes; a provider times out for 40 minutes); a provider's or model's own tokens-per-minute
limit (`targets.*.tokensPerMinute`: a call that would take its last minute over it is answered
429, so a policy's `tokenBudgets` can be tried against it, and every answer reports what is left
of it in the provider's rate-limit headers, so the ledger's learned limits act); and arrivals
(an even or Poisson rate between two times, bursts at a time). Times are `HH:MM` or `HH:MM:SS`
after the start's midnight (`26:30` is 02:30 the next day). `ledger simulate schema` prints the
JSON Schema.

Invariant: validation fails closed with the fixed messages of `ledger.validation` (never a
value); expansion is pure and draws randomness only from the seeded `random.Random` it is given.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections import deque
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ledger.classify import KNOWN_ERROR_CODES
from ledger.clock import parse_duration_ms
from ledger.config import ScopeName
from ledger.errors import UsageError
from ledger.kinds import FailureKind
from ledger.simulate.provider import Reply, TokenReading
from ledger.simulate.workload import DEFAULT_INPUT_BYTES, Arrival, Workload

SCENARIO_FORMAT = "ledger-scenario"
MAX_ARRIVALS = 1_000_000
_CLOCK = re.compile(r"([0-9]{1,3}):([0-5][0-9])(?::([0-5][0-9]))?")
_TARGET = r"^[^/\s]{1,100}(/[^\s]{1,200})?$"
_P95_Z = 1.6448536269514722  # the standard normal's 95th percentile

Clock = Annotated[str, Field(pattern=r"^[0-9]{1,3}:[0-5][0-9](:[0-5][0-9])?$")]
Target = Annotated[str, Field(pattern=_TARGET)]
Count = Annotated[int, Field(ge=1, le=MAX_ARRIVALS)]
Ms = Annotated[int, Field(gt=0, le=24 * 3600 * 1000)]
TokenCount = Annotated[int, Field(ge=0, le=10_000_000)]


def clock_ms(text: str) -> int:
    """`HH:MM[:SS]` as milliseconds after midnight of the start day."""
    match = _CLOCK.fullmatch(text)
    if match is None:  # pragma: no cover - the field pattern checked it
        raise ValueError("rule: must be HH:MM or HH:MM:SS")
    hours, minutes, seconds = int(match[1]), int(match[2]), int(match[3] or 0)
    return ((hours * 60 + minutes) * 60 + seconds) * 1000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Latency(_Strict):
    """Call latency: fixed (`fixedMs`), uniform (`minMs`..`maxMs`) or log-normal
    (`medianMs` with an optional `p95Ms`)."""

    fixed_ms: Ms | None = Field(None, alias="fixedMs")
    min_ms: Ms | None = Field(None, alias="minMs")
    max_ms: Ms | None = Field(None, alias="maxMs")
    median_ms: Ms | None = Field(None, alias="medianMs")
    p95_ms: Ms | None = Field(None, alias="p95Ms")

    @model_validator(mode="after")
    def _one_shape(self) -> Latency:
        shapes = [self.fixed_ms is not None, self.min_ms is not None or self.max_ms is not None,
                  self.median_ms is not None]
        if sum(shapes) != 1:
            raise ValueError("rule: give exactly one of fixedMs, minMs+maxMs, medianMs")
        if shapes[1] and (self.min_ms is None or self.max_ms is None or self.min_ms > self.max_ms):
            raise ValueError("rule: minMs and maxMs both, minMs <= maxMs")
        if self.p95_ms is not None and (self.median_ms is None or self.p95_ms < self.median_ms):
            raise ValueError("rule: p95Ms needs medianMs and must not be below it")
        return self

    def draw(self, rng: random.Random) -> int:
        """One latency in ms."""
        if self.fixed_ms is not None:
            return self.fixed_ms
        if self.min_ms is not None and self.max_ms is not None:
            return rng.randint(self.min_ms, self.max_ms)
        assert self.median_ms is not None
        p95 = self.p95_ms or self.median_ms
        sigma = math.log(p95 / self.median_ms) / _P95_Z
        return max(1, round(rng.lognormvariate(math.log(self.median_ms), sigma)))


TokenSize = TokenCount | Annotated[list[TokenCount], Field(min_length=2, max_length=2)]


class Tokens(_Strict):
    """Reply usage: a fixed count or a `[min, max]` range each."""

    input: TokenSize = 1000
    output: TokenSize = 200

    @staticmethod
    def _draw(size: int | list[int], rng: random.Random) -> int:
        if isinstance(size, int):
            return size
        low, high = sorted(size)
        return rng.randint(low, high)

    def draw(self, rng: random.Random) -> tuple[int, int]:
        """(input tokens, output tokens) of one reply."""
        return self._draw(self.input, rng), self._draw(self.output, rng)


ProviderTokenLimit = Annotated[int, Field(ge=1, le=10**9)]
TOKEN_WINDOW_MS = 60_000
RATE_LIMITED_LATENCY_MS = 100
"""How long the stand-in takes to answer a call over its token limit (a 429 comes at once)."""


class Profile(_Strict):
    """Typical behaviour of a provider or model; `tokensPerMinute` is the provider's OWN limit
    (not the ledger's): a call whose tokens would take the target's last minute over it is
    answered 429 with the Retry-After at which enough of the minute frees, and every answer
    reports what is left of the minute in the provider's rate-limit headers."""

    latency: Latency | None = None
    tokens: Tokens | None = None
    tokens_per_minute: ProviderTokenLimit | None = Field(None, alias="tokensPerMinute")


class Window(_Strict):
    """A time window in which calls to a provider or model fail (with a probability)."""

    target: Target
    from_: Clock = Field(alias="from")
    until: Clock | None = None
    for_: str | None = Field(None, alias="for", pattern=r"^[0-9a-z]{1,20}$")
    outcome: Literal["error", "timeout", "connect_error", "invalid_json", "length"] = "error"
    status: Annotated[int, Field(ge=400, le=599)] | None = None
    error_code: Annotated[str, Field(pattern=r"^[a-z0-9_.-]{1,64}$")] | None = Field(
        None, alias="errorCode"
    )
    retry_after_s: Annotated[int, Field(ge=0, le=7 * 86400)] | None = Field(
        None, alias="retryAfterS"
    )
    probability: Annotated[float, Field(ge=0, le=1)] = 1.0
    latency: Latency | None = None

    @field_validator("for_")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_duration_ms(value)
            except UsageError:
                raise ValueError("rule: a duration such as 20m or 1h30m") from None
        return value

    @model_validator(mode="after")
    def _shape(self) -> Window:
        if (self.until is None) == (self.for_ is None):
            raise ValueError("rule: give exactly one of until and for")
        if self.outcome == "error" and self.status is None and self.error_code is None:
            raise ValueError("rule: an error window needs status or errorCode")
        if self.error_code is not None and self.error_code not in KNOWN_ERROR_CODES:
            raise ValueError("rule: errorCode must be a known provider error code")
        if self.span()[1] <= self.span()[0]:
            raise ValueError("rule: the window must end after it starts")
        return self

    def span(self) -> tuple[int, int]:
        """(start, end) in ms after the start day's midnight."""
        start = clock_ms(self.from_)
        end = clock_ms(self.until) if self.until else start + parse_duration_ms(self.for_ or "")
        return start, end

    def reply(self, latency_ms: int, tokens: tuple[int, int]) -> Reply:
        """The failing reply this window gives."""
        retry = None if self.retry_after_s is None else self.retry_after_s * 1000
        if self.outcome in ("timeout", "connect_error"):
            return Reply(FailureKind.TRANSPORT, self.outcome, latency_ms=latency_ms)
        if self.outcome == "invalid_json":
            return Reply(FailureKind.INVALID_OUTPUT, reason="invalid_json", latency_ms=latency_ms,
                         input_tokens=tokens[0], output_tokens=tokens[1])
        if self.outcome == "length":
            return Reply(FailureKind.INVALID_OUTPUT, "length_stop", latency_ms=latency_ms,
                         input_tokens=tokens[0], output_tokens=tokens[1])
        kind = KNOWN_ERROR_CODES[self.error_code] if self.error_code else FailureKind.UNKNOWN
        return Reply(kind, self.error_code, latency_ms=latency_ms, retry_after_ms=retry,
                     status=self.status)


class Stream(_Strict):
    """Arrivals: `count` sources at `at` (a burst), or `perHour` from `from` until `until`."""

    at: Clock | None = None
    count: Count | None = None
    from_: Clock | None = Field(None, alias="from")
    until: Clock | None = None
    per_hour: Annotated[float, Field(gt=0, le=1_000_000)] | None = Field(None, alias="perHour")
    poisson: bool = False
    input_bytes: Annotated[int, Field(ge=0, le=10**9)] | None = Field(None, alias="inputBytes")
    # R-SC-1: the scopes of recovery.json these sources are added under (a policy that does not
    # define one is not limited by it)
    scopes: Annotated[list[ScopeName], Field(max_length=16)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shape(self) -> Stream:
        burst = self.at is not None and self.count is not None
        rate = self.from_ is not None and self.until is not None and self.per_hour is not None
        if burst == rate or (burst and (self.from_ or self.until or self.per_hour)):
            raise ValueError("rule: give at+count (a burst) or from+until+perHour (a rate)")
        if rate and clock_ms(self.until or "") <= clock_ms(self.from_ or ""):
            raise ValueError("rule: until must be after from")
        return self

    def times(self, rng: random.Random) -> list[int]:
        """Arrival times in ms after the start day's midnight."""
        if self.at is not None and self.count is not None:
            return [clock_ms(self.at)] * self.count
        assert self.from_
        assert self.until
        assert self.per_hour
        start, end, gap = clock_ms(self.from_), clock_ms(self.until), 3_600_000 / self.per_hour
        out: list[int] = []
        t = float(start)
        while t < end and len(out) < MAX_ARRIVALS:
            out.append(int(t))
            t += rng.expovariate(1 / gap) if self.poisson else gap
        return out


class Scenario(_Strict):
    """A whole scenario file."""

    format: Literal["ledger-scenario"] = "ledger-scenario"
    version: Literal[1] = 1
    start: str = Field(
        pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2})?Z$",
        description="The UTC time the scenario starts, e.g. 2026-11-30T00:00Z.",
    )
    hours: Annotated[float, Field(gt=0, le=24 * 31)] = 24
    latency: Latency = Field(default_factory=lambda: Latency(median_ms=1000))
    tokens: Tokens = Field(default_factory=Tokens)
    input_bytes: Annotated[int, Field(ge=0, le=10**9)] = Field(
        DEFAULT_INPUT_BYTES, alias="inputBytes"
    )
    targets: dict[Target, Profile] = Field(default_factory=dict, max_length=10_000)
    windows: list[Window] = Field(default_factory=list, max_length=10_000)
    arrivals: list[Stream] = Field(default_factory=list, max_length=10_000)

    @field_validator("start")
    @classmethod
    def _a_time(cls, value: str) -> str:
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("rule: a UTC time such as 2026-11-30T00:00Z") from None
        return value

    def start_ms(self) -> int:
        """UTC ms of the start."""
        moment = datetime.fromisoformat(self.start.replace("Z", "+00:00")).astimezone(UTC)
        return int(moment.timestamp() * 1000)

    def midnight_ms(self) -> int:
        """UTC ms of the start day's midnight (clock times count from it)."""
        return self.start_ms() - self.start_ms() % 86_400_000


def arrival_outside_span(scenario: Scenario) -> str | None:
    """The field of the first arrival stream that reaches outside the simulated span (from
    `start` for `hours`), else None: such arrivals would be dropped or moved (R-SIM-4)."""
    base = scenario.midnight_ms()
    start = scenario.start_ms()
    end = start + round(scenario.hours * 3_600_000)
    for i, stream in enumerate(scenario.arrivals):
        bounds = (
            [("at", stream.at)]
            if stream.at is not None
            else [("from", stream.from_ or ""), ("until", stream.until or "")]
        )
        for name, value in bounds:
            if not start <= base + clock_ms(value) <= end:
                return f"arrivals[{i}].{name}"
    return None


SPAN_RULE = "must be within the simulated span (from `start`, for `hours`)"


class _TokenMinute:
    """A provider's own tokens-per-minute limit on one target: the calls it answered in the
    rolling minute `(at - 60 s, at]`, each counted with its reply's input + output tokens at the
    time it was made (a call it refuses counts nothing)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._calls: deque[tuple[int, int]] = deque()
        self._used = 0

    def _expire(self, at_ms: int) -> None:
        while self._calls and self._calls[0][0] <= at_ms - TOKEN_WINDOW_MS:
            self._used -= self._calls.popleft()[1]

    def retry_after_ms(self, at_ms: int, tokens: int) -> int | None:
        """None when `tokens` fit now; else the whole seconds until enough of the minute frees
        (a Retry-After header carries seconds)."""
        self._expire(at_ms)
        over = self._used + tokens - self.limit
        if over <= 0:
            return None
        frees_at = at_ms + TOKEN_WINDOW_MS  # alone over the limit: a minute, then again
        for made_ms, counted in self._calls:
            over -= counted
            if over <= 0:
                frees_at = made_ms + TOKEN_WINDOW_MS
                break
        return -(-(frees_at - at_ms) // 1000) * 1000

    def count(self, at_ms: int, tokens: int) -> None:
        self._calls.append((at_ms, tokens))
        self._used += tokens

    def reading(self, at_ms: int) -> TokenReading | None:
        """What the provider reports of this limit on an answer at `at_ms` (not before the last
        call counted): the tokens left of the rolling minute and when it is whole again (the
        last counted call leaves it), as OpenAI and Anthropic report a reset; None while it
        holds nothing."""
        used = sum(t for made, t in self._calls if made > at_ms - TOKEN_WINDOW_MS)
        if used == 0:
            return None
        last = self._calls[-1][0]
        return TokenReading(max(0, self.limit - used), last + TOKEN_WINDOW_MS, self.limit)


class ScenarioBehaviour:
    """Answers from a scenario: the first window active on the model or its provider fails the
    call with its probability; otherwise a call that would take the model's or its provider's
    own `tokensPerMinute` over answers 429 (Retry-After: when enough frees); otherwise a healthy
    reply with the target's profile. Every answer of a target with a `tokensPerMinute` reports
    what is left of it as the answer arrives (the tightest when both the model and its provider
    have one)."""

    def __init__(self, scenario: Scenario, rng: random.Random) -> None:
        self._scenario = scenario
        self._rng = rng
        base = scenario.midnight_ms()
        self._windows = [(w, base + w.span()[0], base + w.span()[1]) for w in scenario.windows]
        self._minutes = {
            target: _TokenMinute(profile.tokens_per_minute)
            for target, profile in scenario.targets.items()
            if profile.tokens_per_minute is not None
        }

    def _profile(self, model: str, provider: str) -> tuple[Latency, Tokens]:
        s = self._scenario
        own = s.targets.get(model) or Profile()
        family = s.targets.get(provider) or Profile()
        return (own.latency or family.latency or s.latency, own.tokens or family.tokens or s.tokens)

    def reply(self, model: str, provider: str, at_ms: int) -> tuple[Reply, bool]:
        """The call's outcome at `at_ms`; every target counts as described."""
        reply = self._outcome(model, provider, at_ms)
        minutes = [m for m in (self._minutes.get(model), self._minutes.get(provider)) if m]
        if not minutes:
            return reply, True
        answered = at_ms + reply.latency_ms
        readings = [r for r in (m.reading(answered) for m in minutes) if r is not None]
        if not readings:
            return reply, True
        tightest = min(readings, key=lambda r: (r.left, -r.reset_at_ms))
        return dataclasses.replace(reply, reading=tightest), True

    def _outcome(self, model: str, provider: str, at_ms: int) -> Reply:
        latency, tokens = self._profile(model, provider)
        rng = self._rng
        for window, start, end in self._windows:
            if window.target in (model, provider) and start <= at_ms < end:
                if window.probability >= 1 or rng.random() < window.probability:
                    drawn = (window.latency or latency).draw(rng)
                    return window.reply(drawn, tokens.draw(rng))
                break
        used = tokens.draw(rng)
        healthy = Reply(latency_ms=latency.draw(rng), input_tokens=used[0], output_tokens=used[1])
        minutes = [m for m in (self._minutes.get(model), self._minutes.get(provider)) if m]
        waits = [m.retry_after_ms(at_ms, sum(used)) for m in minutes]
        if any(w is not None for w in waits):
            wait = max(w for w in waits if w is not None)
            return Reply(FailureKind.RATE_LIMIT, latency_ms=RATE_LIMITED_LATENCY_MS,
                         retry_after_ms=wait, status=429)  # fmt: skip
        for minute in minutes:
            minute.count(at_ms, sum(used))
        return healthy


def scenario_workload(scenario: Scenario, seed: int) -> Workload:
    """A scenario as a workload: arrivals drawn once from the seed, behaviour per run."""
    base = scenario.midnight_ms()
    start = scenario.start_ms()
    rng = random.Random(seed)
    timed: list[tuple[int, int, tuple[str, ...]]] = []
    for stream in scenario.arrivals:
        size = scenario.input_bytes if stream.input_bytes is None else stream.input_bytes
        scopes = tuple(stream.scopes)
        timed.extend((base + t, size, scopes) for t in stream.times(rng))
        if len(timed) > MAX_ARRIVALS:
            raise UsageError(f"a scenario may describe at most {MAX_ARRIVALS} arrivals")
    timed.sort(key=lambda item: item[0])
    arrivals = tuple(
        Arrival(max(start, at), f"s{n:06d}", size, scopes)
        for n, (at, size, scopes) in enumerate(timed, 1)
    )
    end = start + round(scenario.hours * 3_600_000)
    return Workload(
        "scenario", start, end, arrivals, lambda run_rng: ScenarioBehaviour(scenario, run_rng)
    )


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema of scenario files (for editors), built from the models above."""
    schema = Scenario.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ledger simulation scenario"
    return schema
