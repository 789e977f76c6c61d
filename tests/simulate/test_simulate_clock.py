"""Issue 23 / R-SIM-1: inside a simulation every reading of time follows the virtual clock."""

from __future__ import annotations

import time

from ledger import clock
from ledger.simulate.vclock import VirtualClock
from ledger.worker.item import _call_clock


def test_r_sim_1_clock_seam_follows_the_virtual_clock_only_inside() -> None:
    virtual = VirtualClock(1_000_000)
    with clock.virtual_time(virtual.now):
        assert clock.now_ms() == 1_000_000
        before = clock.monotonic_s()
        virtual.advance(2_500)
        assert clock.now_ms() == 1_002_500
        assert clock.monotonic_s() - before == 2.5
    assert clock.now_ms() > 1_700_000_000_000  # outside: the wall clock again


def test_r_sim_1_worker_call_clock_measures_virtual_elapsed_time_not_real_time() -> None:
    virtual = VirtualClock(5_000)
    with clock.virtual_time(virtual.now):
        started = _call_clock(virtual.now)
        call_clock = started(5_000)
        time.sleep(0.05)  # real time passes, virtual time does not
        assert call_clock() == 5_000
        virtual.advance(1_234)
        assert call_clock() == 6_234
