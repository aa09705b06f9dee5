"""Snapshots built off the Raft thread (coordinator/raft/snapshot_writer.py, RAFT.md "Snapshots").

The file must hold exactly the state at its last index, be renamed into place only once fully
written and fsynced, and be reported (SUCCESS, so the journal is compacted) only after that;
a failed write is reported FAILED and leaves the previous file in place.
"""

from __future__ import annotations

import gc
import itertools
import os
import threading
import time
from itertools import pairwise

import msgpack
import pytest
from pysyncobj.config import SERIALIZER_STATE

from coordinator.core import commands as cmds
from coordinator.core import snapshot_pack as sm_module
from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft import snapshot_file
from coordinator.raft.replica import Replica
from coordinator.raft.snapshot_writer import BackgroundSerializer

LAST = (b"", 41, 3)
PREV = (b"", 40, 3)
WAIT_S = 10.0  # for a writer thread on a loaded test machine; each poll ends as soon as it can


def poll(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65_535, 65_536, 300_000])
def test_a_file_written_in_pieces_is_the_file_written_whole(tmp_path, size):
    state = bytes(i % 251 for i in range(size))
    pieces = [state[i : i + 7_000] for i in range(0, size, 7_000)] or [b""]
    whole, in_pieces = tmp_path / "whole", tmp_path / "pieces"
    snapshot_file.write(str(whole), LAST, PREV, state, {"members": ["a"]})
    snapshot_file.write_pieces(str(in_pieces), LAST, PREV, pieces, {"members": ["a"]})
    assert in_pieces.read_bytes() == whole.read_bytes()
    assert snapshot_file.decode(snapshot_file.read_body(str(in_pieces)))[2] == state


_op_ids = (f"op-{n:014d}".encode() for n in itertools.count(1))


def populated(resources: int, *, seed: int = 7) -> FencingStateMachine:
    """Resources with leases, keys and deleted keys, in an order that is not sorted."""
    sm = FencingStateMachine()
    stamp = 1_000
    for i in range(resources):
        name = f"r-{(i * 7919 + seed) % 100_003:06d}"
        stamp += 1
        out = sm.execute(cmds.acquire(resource=name, holder="h", ttl_ms=60_000, op_id=next(_op_ids), stamp_ms=stamp))
        token = out.result.token
        for key in ("b", "a"):
            sm.execute(
                cmds.write(
                    resource=name, key=key, value=b"v" * (i % 5), token=token, op_id=next(_op_ids), stamp_ms=stamp
                )
            )
        if i % 3 == 0:
            sm.execute(cmds.delete(resource=name, key="a", token=token, op_id=next(_op_ids), stamp_ms=stamp))
        if i % 4 == 0:
            sm.execute(cmds.release(resource=name, token=token, op_id=next(_op_ids), stamp_ms=stamp))
    return sm


def test_snapshot_pieces_join_into_the_snapshot(monkeypatch):
    # Small pieces and runs, so a small state crosses every boundary: several pieces, several
    # sorted runs merged.
    monkeypatch.setattr(sm_module, "SNAPSHOT_RESOURCES_PER_PIECE", 7)
    monkeypatch.setattr(sm_module, "_SORT_RUN_NAMES", 11)
    sm = populated(120)
    pieces = list(sm.snapshot_pieces())
    assert len(pieces) > 10
    assert b"".join(pieces) == sm.snapshot()
    parts = msgpack.unpackb(sm.snapshot(), raw=False)
    names = [item[0] for item in parts[4]]
    assert names == sorted(names) and len(names) == 120
    restored = FencingStateMachine()
    restored.restore(b"".join(pieces))
    assert restored.digest() == sm.digest()


def background(tmp_path, machine) -> tuple[BackgroundSerializer, Replica, str]:
    replica = Replica(machine, on_fatal=lambda message, code: pytest.fail(message))
    path = str(tmp_path / snapshot_file.DUMP_NAME)
    serializer = BackgroundSerializer(replica, path, 1 << 16, replica.serialize, replica.deserialize)
    return serializer, replica, path


class GatedMachine:
    """A state machine whose snapshot pieces wait for a gate after the first one."""

    def __init__(self, fail: bool = False):
        self.state = [b"one", b"two", b"three"]
        self.start = threading.Event()  # the first piece waits for it
        self.start.set()
        self.gate = threading.Event()
        self.first_read = threading.Event()
        self.fail = fail

    def snapshot(self) -> bytes:
        return b"".join(self.state)

    def snapshot_pieces(self):
        assert self.start.wait(WAIT_S), "the test never let the first piece go"
        state = list(self.state)
        yield state[0]
        self.first_read.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        if self.fail:
            raise OSError("disk gone")
        yield from state[1:]


def test_the_raft_thread_only_starts_a_snapshot_and_collects_it(tmp_path):
    machine = GatedMachine()
    machine.start.clear()
    serializer, _replica, path = background(tmp_path, machine)
    serializer.serialize((None, LAST, PREV, set()), LAST[1])  # returns while the writer waits
    assert serializer.capturing, "applying must stay paused until the first piece fixes the state"
    machine.start.set()
    assert machine.first_read.wait(WAIT_S)
    # The state is fixed: applying resumes while the rest is read (the machine keeps it).
    poll(lambda: not serializer.capturing, "applying to resume after the first piece")
    assert serializer.checkSerializing() == (SERIALIZER_STATE.SERIALIZING, LAST[1])
    assert not os.path.exists(path), "renamed into place before it was written"
    machine.gate.set()
    poll(lambda: serializer.checkSerializing()[0] != SERIALIZER_STATE.SERIALIZING, "the writer")
    # Reported once (the check above consumed SUCCESS); the file holds the state at LAST.
    assert serializer.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
    assert not serializer.capturing
    last, prev, state, _config = snapshot_file.decode(snapshot_file.read_body(path))
    assert (last, prev, state) == (LAST, PREV, b"onetwothree")
    assert not os.path.exists(path + ".tmp")
    assert serializer.last_duration_s is not None


def test_a_failed_write_is_reported_and_leaves_the_previous_snapshot(tmp_path):
    machine = GatedMachine(fail=True)
    serializer, _replica, path = background(tmp_path, machine)
    snapshot_file.write(path, PREV, PREV, b"older")
    before = open(path, "rb").read()
    serializer.serialize((None, LAST, PREV, set()), LAST[1])
    machine.gate.set()
    results = []

    def reported():
        results.append(serializer.checkSerializing())
        return results[-1][0] != SERIALIZER_STATE.SERIALIZING

    poll(reported, "the failure to be reported")
    assert results[-1] == (SERIALIZER_STATE.FAILED, LAST[1])
    assert not serializer.capturing, "a failure must resume applying"
    assert open(path, "rb").read() == before
    assert not os.path.exists(path + ".tmp")
    # Tried again later: a new snapshot starts and succeeds.
    machine.fail = False
    serializer.serialize((None, LAST, PREV, set()), LAST[1])
    poll(lambda: serializer.checkSerializing()[0] == SERIALIZER_STATE.SUCCESS, "the retry")
    assert snapshot_file.decode(snapshot_file.read_body(path))[2] == b"onetwothree"


def test_a_snapshot_from_the_leader_waits_for_a_running_write(tmp_path):
    """The last chunk of an installed snapshot renames it into place: a write of ours still
    running must not rename its older file over it afterwards."""
    machine = GatedMachine()
    serializer, _replica, path = background(tmp_path, machine)
    serializer.serialize((None, LAST, PREV, set()), LAST[1])
    assert machine.first_read.wait(WAIT_S)
    leaders = str(tmp_path / "leaders")
    snapshot_file.write(leaders, (b"", 90, 4), (b"", 89, 4), b"newer")
    data = open(leaders, "rb").read()
    assert serializer.setTransmissionData((data, True, False)) is False
    opener = threading.Timer(0.05, machine.gate.set)
    opener.start()
    assert serializer.setTransmissionData((b"", False, True)) is True
    opener.join()
    assert snapshot_file.verify(path) == (90, 4)


def test_the_permanent_generation_follows_the_live_state_not_the_operations():
    """freeze_long_lived after every snapshot: objects frozen while alive are still freed by
    their reference counts, so churning the same resources (keys written and deleted, leases
    taken and released, the dedup table turning over) keeps the frozen count level."""
    from coordinator.raft.replica import freeze_long_lived

    gc.unfreeze()
    gc.collect()
    try:
        sm = FencingStateMachine(dedup_entries_max=200)
        names = [f"churn/{i}" for i in range(100)]
        stamp = 1_000
        counts = []
        for round_ in range(30):
            for name in names:
                stamp += 1
                token = sm.execute(cmds.acquire(resource=name, holder="h", ttl_ms=60_000,
                                                op_id=next(_op_ids), stamp_ms=stamp)).result.token
                for k in range(3):
                    key = f"k{round_}-{k}"
                    sm.execute(cmds.write(resource=name, key=key, value=b"v" * 64, token=token,
                                          op_id=next(_op_ids), stamp_ms=stamp))
                    if round_ and k:
                        sm.execute(cmds.delete(resource=name, key=f"k{round_ - 1}-{k}", token=token,
                                               op_id=next(_op_ids), stamp_ms=stamp))
                sm.execute(cmds.release(resource=name, token=token, op_id=next(_op_ids), stamp_ms=stamp))
            try:  # a cycle of the kind that must not pile up: an exception and its traceback
                raise ValueError(round_)
            except ValueError as exc:
                held = exc  # noqa: F841 - the frame holds the exception, the exception the frame
            b"".join(sm.snapshot_pieces())
            freeze_long_lived()
            counts.append(gc.get_freeze_count())
        # Live state after the first rounds: the same resources, one key each kept per round
        # (k0), so it grows by 100 small keys a round; the operations grow by ~900 a round.
        grown = counts[-1] - counts[4]
        per_round = grown / (len(counts) - 5)
        assert per_round < 100 * 8, f"the frozen count grew {per_round:.0f} objects a round: {counts}"
        # The control: live state that grows does show (each resource holds tracked objects).
        for i in range(1_000):
            stamp += 1
            sm.execute(cmds.acquire(resource=f"more/{i}", holder="h", ttl_ms=60_000, op_id=next(_op_ids),
                                    stamp_ms=stamp))
        freeze_long_lived()
        assert gc.get_freeze_count() - counts[-1] >= 1_000
    finally:
        gc.unfreeze()


def test_a_snapshot_that_cannot_start_is_reported_failed_and_applying_goes_on(tmp_path):
    serializer, replica, path = background(tmp_path, GatedMachine())

    def config_at(index):
        raise RuntimeError("no configuration")

    replica.config_at = config_at
    serializer.serialize((None, LAST, PREV, set()), LAST[1])  # on the Raft thread: must not raise
    assert not serializer.capturing
    assert serializer.checkSerializing() == (SERIALIZER_STATE.FAILED, LAST[1])
    assert serializer.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
    assert not os.path.exists(path)


class ManyPieces:
    """A state machine of many pieces, each some work, that notes how many applies it saw."""

    def __init__(self, replica_box: list, pieces: int = 200):
        self.replica_box = replica_box
        self.pieces = pieces
        self.applied = 0  # counted by the applier thread, under the apply lock
        self.seen: list[int] = []

    def snapshot(self) -> bytes:
        return b"x" * self.pieces

    def snapshot_pieces(self):
        for _ in range(self.pieces):
            sum(range(20_000))  # a piece's work, GIL held, as packing resources is
            self.seen.append(self.applied)
            yield b"x"


def test_a_thread_waiting_for_the_apply_lock_gets_it_between_pieces(tmp_path):
    """The Raft thread applies between pieces (copy-on-write): the writer must hand it the lock,
    not take it back at once for the next piece (a follower's tick waited out ~1 s reads)."""
    box: list = []
    machine = ManyPieces(box)
    serializer, replica, path = background(tmp_path, machine)
    stop = threading.Event()

    def applier():
        while not stop.is_set():
            with replica.lock:
                machine.applied += 1

    thread = threading.Thread(target=applier, daemon=True)
    thread.start()
    try:
        serializer.serialize((None, LAST, PREV, set()), LAST[1])
        poll(lambda: serializer.checkSerializing()[0] == SERIALIZER_STATE.SUCCESS, "the snapshot")
    finally:
        stop.set()
        thread.join(WAIT_S)
    between = sum(1 for a, b in pairwise(machine.seen) if b > a)
    print(f"the applier got the lock between {between} of {len(machine.seen) - 1} pairs of pieces")
    assert between >= (len(machine.seen) - 1) // 2
