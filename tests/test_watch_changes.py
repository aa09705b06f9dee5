"""What each applied entry changed, as the state machine reports it for Watch (core/changes.py):
every lease grant and end, write and delete, with the lease or key it concerns; nothing for a
refusal or a retry answered from the dedup table."""

from __future__ import annotations

import itertools

from coordinator.core import commands as cmds
from coordinator.core.changes import Change, ChangeKind
from coordinator.core.state_machine import Applied, FencingStateMachine, Rejected

K = ChangeKind
_ids = itertools.count(1)


def op_id() -> bytes:
    return next(_ids).to_bytes(16, "big")


def run(sm: FencingStateMachine, command: cmds.Command) -> tuple[Change, ...]:
    outcome = sm.execute(command)
    assert isinstance(outcome, Applied), outcome
    return outcome.changes


def acquire(sm, resource="jobs/a", holder="A", stamp=1000, ttl_ms=1000):
    return run(sm, cmds.acquire(resource=resource, holder=holder, ttl_ms=ttl_ms, op_id=op_id(), stamp_ms=stamp))


def test_acquire_write_delete_release():
    sm = FencingStateMachine()
    assert acquire(sm) == (Change(K.ACQUIRED, "jobs/a", "A", 1, 2000),)
    assert run(sm, cmds.write(resource="jobs/a", key="k", value=b"v", token=1, op_id=op_id(), stamp_ms=1001)) == (
        Change(K.WRITTEN, "jobs/a", token=1, key="k", value=b"v", version=1),)
    assert run(sm, cmds.delete(resource="jobs/a", key="k", token=1, op_id=op_id(), stamp_ms=1002)) == (
        Change(K.DELETED, "jobs/a", token=1, key="k", version=2),)
    assert run(sm, cmds.release(resource="jobs/a", token=1, stamp_ms=1003)) == (
        Change(K.RELEASED, "jobs/a", "A", 1, 2000),)


def test_expiry_by_tick_grants_the_head_waiter_in_the_same_entry():
    sm = FencingStateMachine()
    acquire(sm)
    run(sm, cmds.enqueue(resource="jobs/a", holder="B", ttl_ms=5000, waiter_id=b"w" * 16, stamp_ms=1500))
    assert run(sm, cmds.tick(stamp_ms=2500)) == (
        Change(K.EXPIRED, "jobs/a", "A", 1, 2000),
        Change(K.ACQUIRED, "jobs/a", "B", 2, 7500),
    )


def test_an_acquire_over_an_expired_lease_reports_its_expiry_first():
    sm = FencingStateMachine()
    acquire(sm)
    assert acquire(sm, holder="B", stamp=3000) == (
        Change(K.EXPIRED, "jobs/a", "A", 1, 2000), Change(K.ACQUIRED, "jobs/a", "B", 2, 4000))


def test_force_release_and_fence_all():
    sm = FencingStateMachine()
    acquire(sm)
    acquire(sm, resource="jobs/b", holder="B")
    assert run(sm, cmds.force_release(resource="jobs/a", op_id=op_id(), stamp_ms=1100)) == (
        Change(K.FORCE_RELEASED, "jobs/a", "A", 1, 2000),)
    assert run(sm, cmds.force_release(resource="jobs/c", op_id=op_id(), stamp_ms=1100)) == (
        Change(K.FORCE_RELEASED, "jobs/c"),)
    assert run(sm, cmds.set_epoch_floor(floor=10, stamp_ms=1200)) == (
        Change(K.FORCE_RELEASED, "jobs/b", "B", 2, 2000),)


def test_refusals_retries_and_reads_change_nothing():
    sm = FencingStateMachine()
    first = op_id()
    command = cmds.acquire(resource="jobs/a", holder="A", ttl_ms=1000, op_id=first, stamp_ms=1000)
    assert run(sm, command)
    assert run(sm, command) == ()  # a retry answered from the dedup table
    refused = sm.execute(cmds.acquire(resource="jobs/a", holder="B", ttl_ms=1000, op_id=op_id(), stamp_ms=1001))
    assert isinstance(refused, Rejected)
    assert run(sm, cmds.read_barrier(stamp_ms=1002, resource="jobs/a")) == ()
    assert run(sm, cmds.keep_alive(resource="jobs/a", token=1, stamp_ms=1003)) == ()
