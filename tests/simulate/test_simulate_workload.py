"""Issue 23 / R-SIM-2: how a recorded trace answers the simulator's calls (pure, no ledger)."""

from __future__ import annotations

from ledger.kinds import FailureKind
from ledger.simulate.trace import Trace, TraceAttempt
from ledger.simulate.workload import TraceBehaviour, trace_workload

START = 1_800_000_000_000


def _trace() -> Trace:
    def attempt(at: int, kind: str | None) -> TraceAttempt:
        return TraceAttempt.model_validate({
            "atMs": at, "source": 1, "model": "p/m", "durationMs": 700,
            "status": "failed" if kind else "succeeded", "kind": kind,
            "subkind": "http_503" if kind else None, "inputBytes": 1234,
        })

    return Trace.model_validate({
        "startMs": START, "endMs": 10_000,
        "attempts": [attempt(0, None), attempt(4_000, "transport"), attempt(6_000, None),
                     TraceAttempt.model_validate({"atMs": 6_500, "source": 2, "model": "p/m",
                                                  "status": "cancelled"})],
        "arrivals": [{"atMs": 0, "source": 1}, {"atMs": 5, "source": 2}],
    })


def test_r_sim_2_time_replay_answers_with_the_outcome_nearest_in_time() -> None:
    behaviour = TraceBehaviour(_trace(), "time")
    kinds = [behaviour.reply("p/m", "p", START + t)[0].kind for t in (1_000, 3_500, 5_200, 9_000)]
    assert kinds == [None, FailureKind.TRANSPORT, None, None]
    reply, observed = behaviour.reply("p/m", "p", START + 4_100)
    assert (reply.subkind, reply.latency_ms, observed) == ("http_503", 700, True)


def test_r_sim_2_after_the_recording_and_on_unseen_models_targets_answer_healthy() -> None:
    behaviour = TraceBehaviour(_trace(), "time")
    late, observed = behaviour.reply("p/m", "p", START + 6_701)  # after the last call's end
    assert (late.kind, observed) == (None, False)
    unseen, observed = behaviour.reply("q/other", "q", START + 4_000)
    assert (unseen.kind, unseen.latency_ms, observed) == (None, 700, False)


def test_r_sim_2_sequence_replay_gives_the_nth_outcome_to_the_nth_call() -> None:
    behaviour = TraceBehaviour(_trace(), "sequence")
    replies = [behaviour.reply("p/m", "p", START)[0] for _ in range(4)]
    assert [r.kind for r in replies] == [None, FailureKind.TRANSPORT, None, None]
    assert behaviour.reply("p/m", "p", START)[1] is False  # the cancelled attempt is no outcome


def test_r_sim_2_trace_arrivals_keep_their_recorded_sizes() -> None:
    workload = trace_workload(_trace())
    assert [(a.at_ms - START, a.source, a.input_bytes) for a in workload.arrivals] == [
        (0, "s000001", 1234), (5, "s000002", 4000)]
    assert workload.end_ms == START + 6_700  # the last event, not the export (endMs)
    assert workload.worker_start_ms == START  # the first recorded call
