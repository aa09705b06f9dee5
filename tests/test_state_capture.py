"""A snapshot read while entries are applied (copy-on-write, ResourceTable) holds the state it
started with, byte for byte, and leaves the live state as applying alone would.

The snapshot writer thread reads ``snapshot_pieces()`` one piece per hold of the apply lock, and
applying resumes after the first piece (coordinator/raft/replica.py). Here random commands of
every kind that changes a resource (acquire, write, delete, release, keep-alive, force-release,
fencing all, expiry by TICK, lock queue, a whole restore) are applied between the pieces, with
one resource per piece so every resource can change before it is read.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import commands as c
from coordinator.core import snapshot_pack as snapshot_pack_module
from coordinator.core.state_machine import FencingStateMachine
from testsupport.backups import restore_commands

NAMES = [f"r{i}" for i in range(6)]
KEYS = ["a", "b"]
KINDS = ["acquire", "write", "delete", "release", "keep_alive", "force_release", "fence_all", "floor",
         "tick", "enqueue", "dequeue", "restore"]


@pytest.fixture(autouse=True)
def one_resource_per_piece(monkeypatch):
    monkeypatch.setattr(snapshot_pack_module, "SNAPSHOT_RESOURCES_PER_PIECE", 1)
    monkeypatch.setattr(snapshot_pack_module, "_SORT_RUN_NAMES", 2)


class Driver:
    """Draws commands against the machine's current state (tokens it holds, so writes apply)."""

    def __init__(self, data) -> None:
        self.data = data
        self.stamp = 1_000
        self.log: list[bytes] = []

    def command(self, sm: FencingStateMachine) -> list[bytes]:
        """The entries of one drawn command (several for a restore)."""
        draw = self.data.draw
        kind = draw(st.sampled_from(KINDS))
        name = draw(st.sampled_from(NAMES))
        self.stamp += draw(st.sampled_from([0, 1, 50, 400]))
        stamp = self.stamp
        lease = (sm.describe(name) or {}).get("lease")
        token = lease["token"] if lease else draw(st.integers(1, 3))
        op_id = os.urandom(16)
        if kind == "acquire":
            cmd = c.acquire(resource=name, holder=draw(st.sampled_from(["h1", "h2"])),
                            ttl_ms=draw(st.sampled_from([100, 300, 5_000])), op_id=op_id, stamp_ms=stamp)
        elif kind == "write":
            cmd = c.write(resource=name, key=draw(st.sampled_from(KEYS)), value=os.urandom(4), token=token,
                          op_id=op_id, stamp_ms=stamp)
        elif kind == "delete":
            cmd = c.delete(resource=name, key=draw(st.sampled_from(KEYS)), token=token, op_id=op_id, stamp_ms=stamp)
        elif kind == "release":
            cmd = c.release(resource=name, token=token, op_id=op_id, stamp_ms=stamp)
        elif kind == "keep_alive":
            cmd = c.keep_alive(resource=name, token=token, stamp_ms=stamp)
        elif kind == "force_release":
            cmd = c.force_release(resource=name, op_id=op_id, stamp_ms=stamp)
        elif kind in ("fence_all", "floor"):
            cmd = c.set_epoch_floor(floor=sm.epoch + 1, stamp_ms=stamp, fence_all=kind == "fence_all")
        elif kind == "tick":
            cmd = c.tick(stamp_ms=stamp)
        elif kind == "enqueue":
            cmd = c.enqueue(resource=name, holder="w", ttl_ms=300, waiter_id=bytes([NAMES.index(name)]) * 16,
                            stamp_ms=stamp)
        elif kind == "dequeue":
            cmd = c.dequeue(resource=name, waiter_id=bytes([NAMES.index(name)]) * 16, stamp_ms=stamp)
        else:  # a restore: its BEGIN, CHUNKs and COMMIT, as the server proposes them
            return [cmd.encode() for cmd in restore_commands(sm.backup(), epoch_floor=sm.epoch + 1, stamp_ms=stamp)]
        return [cmd.encode()]

    def apply(self, sm: FencingStateMachine, count: int) -> None:
        for _ in range(count):
            for entry in self.command(sm):
                self.log.append(entry)
                sm.apply(entry, len(self.log))


@settings(max_examples=250, deadline=None)
@given(st.data())
def test_pieces_hold_the_state_at_the_first_piece_while_entries_apply_between_them(data):
    sm = FencingStateMachine(dedup_entries_max=6)
    driver = Driver(data)
    driver.apply(sm, data.draw(st.integers(0, 25), label="entries before"))
    started_with = sm.snapshot()
    pieces = sm.snapshot_pieces()
    read = [next(pieces)]
    while not read[-1]:  # empty pieces copy the names; the first non-empty one fixes the state
        read.append(next(pieces))
    for piece in pieces:  # entries apply from here on
        read.append(piece)
        driver.apply(sm, data.draw(st.integers(0, 3), label="entries between pieces"))
    assert b"".join(read) == started_with
    assert sm._resources.capture is None, "the capture ended with its last piece"
    # What was applied during the read changed the live state as it would without one.
    twin = FencingStateMachine(dedup_entries_max=6)
    for index, entry in enumerate(driver.log, start=1):
        twin.apply(entry, index)
    assert sm.snapshot() == twin.snapshot()


def test_a_capture_left_early_ends_and_a_second_one_meanwhile_is_refused():
    sm = FencingStateMachine()
    sm.execute(c.acquire(resource="r", holder="h", ttl_ms=1_000, op_id=b"o" * 16, stamp_ms=1))
    pieces = sm.snapshot_pieces()
    next(pieces)
    assert sm._resources.capture is not None
    with pytest.raises(RuntimeError, match="being read already"):
        next(sm.snapshot_pieces())
    assert sm.backup()  # a whole backup meanwhile reads the live state, no capture of its own
    pieces.close()  # the snapshot writer's failure path (under the apply lock)
    assert sm._resources.capture is None
    assert b"".join(sm.snapshot_pieces()) == sm.snapshot()


def test_a_large_table_names_are_copied_a_slice_per_piece_before_the_state_is_fixed(monkeypatch):
    monkeypatch.setattr(snapshot_pack_module, "_NAMES_COPIED_PER_PIECE", 3)
    sm = FencingStateMachine()
    for i in range(7):
        sm.execute(c.acquire(resource=f"n{i}", holder="h", ttl_ms=1_000, op_id=bytes([i]) * 16, stamp_ms=1))
    pieces = list(sm.snapshot_pieces())
    assert pieces[:2] == [b"", b""] and pieces[2], "7 names: two full slices, then the header"
    assert b"".join(pieces) == sm.snapshot()
