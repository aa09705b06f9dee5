"""The stamping rule (DESIGN I6, coordinator/raft/stamp_clock.py), with a manual monotonic clock.

A stamp is the log clock advanced by the leader's monotonic time, at most STAMP_ADVANCE_MS_MAX
per stamp, restarted from the applied log clock in every term; no wall clock is read.
"""

from __future__ import annotations

import os
import time

import pytest

from coordinator.core import commands
from coordinator.core.state_machine import Applied, FencingStateMachine, Reason, Rejected
from coordinator.raft.limits import STAMP_ADVANCE_MS_MAX
from coordinator.raft.stamp_clock import StampClock

HOUR_MS = 3_600_000


class ManualClock:
    """A monotonic clock the test moves by hand (any way: jumps and steps back included)."""

    def __init__(self, now_ms: int = 1_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def lead(clock: StampClock, log_clock_ms: int, term: int = 1) -> int:
    """The stamp ``clock`` makes for a leader of ``term`` whose applied log clock reads so."""
    return clock.stamp(term=term, leading=True, log_clock_ms=log_clock_ms)


# Scripts of (monotonic ms moved first, term, leads?, applied log clock, the stamp expected).
SCRIPTS = {
    # A new leader continues from the applied log clock, whatever its monotonic clock reads.
    "new leader": [(10**9, 1, True, 70_000, 70_000)],
    "elapsed time": [(0, 1, True, 5_000, 5_000), (250, 1, True, 5_000, 5_250),
                     (0, 1, True, 5_250, 5_250), (1_000, 1, True, 5_250, 6_250)],
    # A jump of any size moves one stamp by the bound; after it, time counts as before.
    "jump just past the bound": [(0, 1, True, 5_000, 5_000), (STAMP_ADVANCE_MS_MAX + 1, 1, True, 5_000, 7_000),
                                 (100, 1, True, 7_000, 7_100)],
    "jump of ten years": [(0, 1, True, 5_000, 5_000), (10 * 365 * 24 * HOUR_MS, 1, True, 5_000, 7_000),
                          (100, 1, True, 7_000, 7_100)],
    "monotonic going back": [(0, 1, True, 5_000, 5_000), (-HOUR_MS // 2, 1, True, 5_000, 5_000),
                             (40, 1, True, 5_000, 5_040)],
    # An older leader's stamps applied since (or a restore) put the log clock ahead.
    "log clock ahead": [(0, 1, True, 5_000, 5_000), (10, 1, True, 9_000, 9_000)],
    # It led term 1 up to 5_000; another leader's slower clock ran the log to 5_300 while 3 s
    # passed here. Leading term 3, it starts from 5_300, not 5_000 + 3_000: its own chain
    # would run ahead of leases the other leader granted at 5_300.
    "leading again": [(0, 1, True, 5_000, 5_000), (3_000, 2, False, 5_300, 0), (0, 3, True, 5_300, 5_300)],
    "not leading": [(0, 3, False, 50_000, 0)],
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_stamping_rule(name):
    mono = ManualClock(now_ms=HOUR_MS)
    clock = StampClock(mono)
    for step, (moved_ms, term, leading, log_clock_ms, expected) in enumerate(SCRIPTS[name]):
        mono.now_ms += moved_ms
        assert clock.stamp(term=term, leading=leading, log_clock_ms=log_clock_ms) == expected, (name, step)


def test_no_wall_clock_is_read(monkeypatch):
    def stepped(*_args):
        raise AssertionError("the stamp read a wall clock")

    monkeypatch.setattr(time, "time", stepped)
    monkeypatch.setattr(time, "time_ns", stepped)
    clock = StampClock()  # the real monotonic clock
    first = lead(clock, 5_000)
    assert 5_000 <= lead(clock, first) <= 5_000 + STAMP_ADVANCE_MS_MAX


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="advance_ms_max"):
        StampClock(ManualClock(), advance_ms_max=0)


# -- with the state machine: what the rule means for a lease --------------------------------------


def _run_ticks(machine, clock, mono, ms: int, every_ms: int = 500) -> None:
    """``ms`` of leader time pass, with a TICK stamped every ``every_ms`` (the leader's job)."""
    while ms > 0:
        step = min(ms, every_ms)
        mono.now_ms += step
        ms -= step
        stamp = lead(clock, machine.log_clock_ms)
        assert isinstance(machine.apply(commands.tick(stamp_ms=stamp).encode()), Applied)


def _acquire(machine, clock, holder: str, ttl_ms: int = 60_000):
    stamp = lead(clock, machine.log_clock_ms)
    command = commands.acquire(resource="r", holder=holder, ttl_ms=ttl_ms, op_id=os.urandom(16),
                               stamp_ms=stamp)
    return machine.apply(command.encode())


def test_a_monotonic_jump_does_not_hand_a_held_lease_to_a_second_holder():
    mono = ManualClock()
    clock = StampClock(mono)
    machine = FencingStateMachine()
    assert isinstance(_acquire(machine, clock, "a"), Applied)  # log clock 0, expires at 60_000
    real_ms = 1_700  # 1.7 s later, as in the finding, the leader's clock jumped by an hour
    mono.now_ms += real_ms + HOUR_MS
    refused = _acquire(machine, clock, "b")
    assert isinstance(refused, Rejected) and refused.reason is Reason.LEASE_HELD
    # The jump counted as the bound (2 s); from here on the clock keeps time: the lease ends
    # after 58 s more, 59.7 s in all, so the jump shortened it by 300 ms, less than the bound.
    _run_ticks(machine, clock, mono, 60_000 - STAMP_ADVANCE_MS_MAX - 1)
    real_ms += 60_000 - STAMP_ADVANCE_MS_MAX - 1
    assert isinstance(_acquire(machine, clock, "b"), Rejected)
    mono.now_ms += 1
    real_ms += 1
    assert isinstance(_acquire(machine, clock, "b"), Applied)
    assert 60_000 - STAMP_ADVANCE_MS_MAX <= real_ms < 60_000


def test_a_lease_ends_after_its_ttl_of_leader_monotonic_time():
    mono = ManualClock()
    clock = StampClock(mono)
    machine = FencingStateMachine()
    assert isinstance(_acquire(machine, clock, "a", ttl_ms=1_000), Applied)
    mono.now_ms += 999
    assert isinstance(_acquire(machine, clock, "b", ttl_ms=1_000), Rejected)
    mono.now_ms += 1
    assert isinstance(_acquire(machine, clock, "b", ttl_ms=1_000), Applied)
