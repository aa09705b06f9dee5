"""The TICK's expiry index (coordinator/core/expiry.py) finds exactly what a full scan finds."""

from __future__ import annotations

import os
import random

import pytest

from coordinator.core import commands, expiry
from coordinator.core.state_machine import Applied, FencingStateMachine


def _expired_by_scan(machine: FencingStateMachine, now_ms: int) -> set[str]:
    return {
        name for name, res in machine._resources.items()
        if res.lease is not None and res.lease.expires_at_ms <= now_ms
    }


def _apply(machine: FencingStateMachine, command: commands.Command):
    return machine.apply(command.encode())


@pytest.mark.parametrize("seed", range(20))
def test_a_tick_ends_exactly_the_leases_a_scan_would(seed):
    rng = random.Random(seed)
    print("seed", seed)
    machine = FencingStateMachine()
    tokens: dict[str, int] = {}
    saved = machine.snapshot()
    now = 0
    for _ in range(400):
        now += rng.randrange(0, 300)
        resource = f"r{rng.randrange(12)}"
        choice = rng.random()
        if choice < 0.35:
            out = _apply(machine, commands.acquire(resource=resource, holder="h", ttl_ms=rng.randrange(100, 2_000),
                                                   op_id=os.urandom(16), stamp_ms=now))
            if isinstance(out, Applied):
                tokens[resource] = out.result.token
        elif choice < 0.6 and resource in tokens:
            _apply(machine, commands.keep_alive(resource=resource, token=tokens[resource],
                                                ttl_ms=rng.randrange(100, 2_000), stamp_ms=now))
        elif choice < 0.7 and resource in tokens:
            _apply(
                machine, commands.release(resource=resource, token=tokens[resource], op_id=os.urandom(16), stamp_ms=now)
            )
        elif choice < 0.8 and resource in tokens:
            _apply(machine, commands.write(resource=resource, key="k", value=b"v", token=tokens[resource],
                                           op_id=os.urandom(16), stamp_ms=now))
        elif choice < 0.82:
            saved = machine.snapshot()
        elif choice < 0.85:
            # A snapshot load (here of an older state, whose leases a TICK may have ended
            # since) replaces the resources wholesale; the index must notice.
            restored = FencingStateMachine()
            restored.restore(saved)
            restored._expiry = machine._expiry
            machine = restored
            tokens = {name: res.lease.token for name, res in machine._resources.items() if res.lease}
        else:
            expected = _expired_by_scan(machine, max(now, machine.log_clock_ms))
            out = _apply(machine, commands.tick(stamp_ms=now))
            assert isinstance(out, Applied) and out.result.expired == len(expected), seed
            assert not _expired_by_scan(machine, max(now, machine.log_clock_ms)), seed
            for name in expected:  # forgotten, or kept only for its data
                res = machine._resources.get(name)
                assert res is None or (res.lease is None and res.data), seed


def test_stale_entries_are_bounded_by_rebuilding():
    index = expiry.ExpiryIndex()
    resources: dict = {}
    index.expired(resources, 0)
    for n in range(3 * expiry.REBUILD_SLACK_ENTRIES):
        index.add(10**6 + n, "gone")  # renewals of a resource that no longer exists
    assert index.expired(resources, 0) == []
    assert len(index._heap) == 0
