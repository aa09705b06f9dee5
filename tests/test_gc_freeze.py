"""The GC policy of a member (coordinator/raft/replica.py ``FreezeAfterSlowFullPass``): after a
full pass slower than its limit, what survived it is frozen, so the next full pass walks only
what was made since; faster passes and young collections freeze nothing, and garbage the
slow pass found is freed, not frozen. ``python -m bench scale`` shows its effect on a member.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from coordinator.raft.replica import FreezeAfterSlowFullPass, freeze_after_slow_full_passes


class Node:
    def __init__(self) -> None:
        self.other = self  # a cycle: only the cyclic GC frees it


@pytest.fixture
def policy():
    installed: list[FreezeAfterSlowFullPass] = []

    def install(slow_s: float) -> FreezeAfterSlowFullPass:
        callback = FreezeAfterSlowFullPass(slow_s)
        gc.callbacks.append(callback)
        installed.append(callback)
        return callback

    gc.collect()
    gc.unfreeze()
    try:
        yield install
    finally:
        for callback in installed:
            gc.callbacks.remove(callback)
        gc.unfreeze()


def test_a_slow_full_pass_freezes_its_survivors_and_frees_its_garbage(policy):
    callback = policy(slow_s=0.0)  # every full pass counts as slow
    kept = [Node() for _ in range(1000)]
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage
    gc.collect(1)
    assert callback.freezes == 0 and gc.get_freeze_count() == 0, "a young collection freezes nothing"
    gc.collect()
    assert gone() is None, "the cycle the pass found unreachable was freed, not frozen"
    assert callback.freezes == 1 and gc.get_freeze_count() >= len(kept)


def test_a_fast_full_pass_freezes_nothing(policy):
    callback = policy(slow_s=3600.0)
    gc.collect()
    assert callback.freezes == 0 and gc.get_freeze_count() == 0


def test_a_member_installs_it_once():
    before = list(gc.callbacks)
    try:
        first = freeze_after_slow_full_passes()
        assert freeze_after_slow_full_passes() is first
        assert sum(isinstance(cb, FreezeAfterSlowFullPass) for cb in gc.callbacks) == 1
    finally:
        gc.callbacks[:] = before
