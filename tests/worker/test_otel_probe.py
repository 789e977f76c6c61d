"""R-OTEL-1 on the attempt protocol itself (ledger.attempt): an attempt watched by the tracing
seam gets its CLIENT span at its one settle, a recovery probe (R-POL-9) marked
`ledger.attempt.probe = true`. A real ledger (migrations, a frozen clock), the tracing configured
in this process, the spans over OTLP/HTTP to the real receiver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger import telemetry
from ledger.attempt import Attempt, failed, settle, success
from ledger.classify import classify_http
from ledger.records import Reservation, Success
from ledger.store.views import cooldown_list
from tests.support.ledgers import Clock, LedgerFactory
from tests.support.otlp_receiver import Receiver

MODEL = "alpha/small"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as found:
        env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": found.endpoint + "/v1/traces",
               "OTEL_BSP_SCHEDULE_DELAY": "20"}  # fmt: skip
        assert telemetry.configure(env, print)
        try:
            yield found
        finally:
            telemetry.shutdown()


def _attempt(reservation: Reservation, number: int = 1) -> Attempt[None]:
    attempt: Attempt[None] = Attempt(number, reservation.model, reservation, reservation.model,
                                     None)  # fmt: skip
    telemetry.watch(attempt, "alpha", "small", 64)
    return attempt


def test_r_otel_1_a_recovery_probe_is_marked(
    make_ledger: LedgerFactory, clock: Clock, receiver: Receiver
) -> None:
    led = make_ledger()
    for source in ("s0", "s1"):  # two transport strikes cool the model (R-POL-10)
        attempt = _attempt(led.reserve(source, MODEL))
        settle(attempt, failed(classify_http(503, {}, None, clock.ms)), led.settle)
    _, rows = cooldown_list(led.db)
    until = max(c.until_ms for c in rows if c.target == MODEL)
    clock.ms = until  # the cooldown ended: the next reservation is the probe
    probe = _attempt(led.reserve("p", MODEL))
    settle(probe, success(Success(input_tokens=3, output_tokens=2)), led.settle)
    after = _attempt(led.reserve("q", MODEL))
    settle(after, success(Success(input_tokens=3, output_tokens=2)), led.settle)
    receiver.wait_for(lambda r: len(r.spans) >= 4)
    spans = sorted(receiver.spans, key=lambda s: s.attributes["ledger.reservation.id"])
    assert [s.attributes["ledger.attempt.probe"] for s in spans] == [False, False, True, False]
    assert [s.attributes.get("error.type") for s in spans] == ["transport", "transport", None, None]
    assert spans[2].attributes["gen_ai.usage.input_tokens"] == 3
    assert all(s.name == "chat small" and s.parent_id == "" for s in spans)  # no request: roots
