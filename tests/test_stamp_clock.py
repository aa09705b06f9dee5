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


def test_a_member_that_does_not_lead_stamps_zero():
    clock = StampClock(ManualClock())
    assert clock.stamp(term=3, leading=False, log_clock_ms=50_000) == 0


def test_a_new_leader_continues_from_the_applied_log_clock():
    mono = ManualClock(now_ms=10**9)  # its own monotonic reading says nothing about the log
    clock = StampClock(mono)
    assert clock.stamp(term=1, leading=True, log_clock_ms=70_000) == 70_000


def test_later_stamps_advance_by_monotonic_elapsed_time():
    mono = ManualClock()
    clock = StampClock(mono)
    assert clock.stamp(term=1, leading=True, log_clock_ms=5_000) == 5_000
    mono.now_ms += 250
    assert clock.stamp(term=1, leading=True, log_clock_ms=5_000) == 5_250
    assert clock.stamp(term=1, leading=True, log_clock_ms=5_250) == 5_250  # no time: no advance
    mono.now_ms += 1_000
    assert clock.stamp(term=1, leading=True, log_clock_ms=5_250) == 6_250


@pytest.mark.parametrize("jump_ms", [STAMP_ADVANCE_MS_MAX + 1, HOUR_MS, 10 * 365 * 24 * HOUR_MS])
def test_a_monotonic_jump_moves_one_stamp_by_at_most_the_bound(jump_ms):
    mono = ManualClock()
    clock = StampClock(mono)
    first = clock.stamp(term=1, leading=True, log_clock_ms=5_000)
    mono.now_ms += jump_ms
    second = clock.stamp(term=1, leading=True, log_clock_ms=first)
    assert second - first == STAMP_ADVANCE_MS_MAX
    mono.now_ms += 100  # after the jump, time is counted as before
    assert clock.stamp(term=1, leading=True, log_clock_ms=second) == second + 100


def test_a_monotonic_clock_going_back_moves_nothing_back():
    mono = ManualClock(now_ms=HOUR_MS)
    clock = StampClock(mono)
    first = clock.stamp(term=1, leading=True, log_clock_ms=5_000)
    mono.now_ms -= HOUR_MS // 2
    assert clock.stamp(term=1, leading=True, log_clock_ms=first) == first
    mono.now_ms += 40
    assert clock.stamp(term=1, leading=True, log_clock_ms=first) == first + 40


def test_a_stamp_is_never_below_the_applied_log_clock():
    mono = ManualClock()
    clock = StampClock(mono)
    clock.stamp(term=1, leading=True, log_clock_ms=5_000)
    mono.now_ms += 10
    # An older leader's stamps applied since (or a restore) put the log clock ahead.
    assert clock.stamp(term=1, leading=True, log_clock_ms=9_000) == 9_000


def test_a_member_leading_again_does_not_continue_its_old_chain():
    # It led term 1 up to stamp 5_000, then another leader's (slower) clock ran the log to
    # 5_300 while 3 s passed here. Leading term 3, it starts from 5_300, not 5_000 + 3_000:
    # its own chain would run ahead of leases the other leader granted at 5_300.
    mono = ManualClock()
    clock = StampClock(mono)
    assert clock.stamp(term=1, leading=True, log_clock_ms=5_000) == 5_000
    mono.now_ms += 3_000
    assert clock.stamp(term=2, leading=False, log_clock_ms=5_300) == 0
    assert clock.stamp(term=3, leading=True, log_clock_ms=5_300) == 5_300


def test_no_wall_clock_is_read(monkeypatch):
    def stepped(*_args):
        raise AssertionError("the stamp read a wall clock")

    monkeypatch.setattr(time, "time", stepped)
    monkeypatch.setattr(time, "time_ns", stepped)
    clock = StampClock()  # the real monotonic clock
    first = clock.stamp(term=1, leading=True, log_clock_ms=5_000)
    assert 5_000 <= clock.stamp(term=1, leading=True, log_clock_ms=first) <= 5_000 + STAMP_ADVANCE_MS_MAX


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
        stamp = clock.stamp(term=1, leading=True, log_clock_ms=machine.log_clock_ms)
        assert isinstance(machine.apply(commands.tick(stamp_ms=stamp).encode()), Applied)


def _acquire(machine, clock, holder: str, ttl_ms: int = 60_000):
    stamp = clock.stamp(term=1, leading=True, log_clock_ms=machine.log_clock_ms)
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
