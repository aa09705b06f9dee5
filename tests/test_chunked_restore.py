"""A restore staged in chunks (RESTORE_BEGIN, RESTORE_CHUNK..., RESTORE_COMMIT), in the state
machine alone: the happy path brings the backup back fenced, every crafted sequence is refused and
changes nothing, the staging is part of the snapshot, and version 1 snapshots still load."""

from __future__ import annotations

import hashlib

import msgpack
import pytest

from coordinator.core import commands as cmds
from coordinator.core import limits, snapshot_format
from coordinator.core.outcomes import Applied, Rejected
from coordinator.core.state_machine import FencingStateMachine
from testsupport.backups import backup_of_size

ID, OTHER = b"i" * 16, b"o" * 16


def busy() -> FencingStateMachine:
    sm = FencingStateMachine()
    out = sm.execute(cmds.acquire(resource="live", holder="h", ttl_ms=60_000, op_id=b"a" * 16, stamp_ms=10))
    assert isinstance(out, Applied)
    return sm


def begin(data: bytes, *, rid=ID, size=None, digest=None, floor=100, stamp=20):
    return cmds.restore_begin(restore_id=rid, size=len(data) if size is None else size,
                              digest=hashlib.sha256(data).digest() if digest is None else digest,
                              epoch_floor=floor, stamp_ms=stamp)


def chunks(data: bytes, *, rid=ID, stamp=21):
    step = limits.BACKUP_CHUNK_BYTES
    return [cmds.restore_chunk(restore_id=rid, seq=n, chunk=data[o:o + step], stamp_ms=stamp)
            for n, o in enumerate(range(0, len(data), step))]


def run(sm, *commands):
    return [sm.apply(c.encode()) for c in commands]


BACKUP = backup_of_size(3 * limits.BACKUP_CHUNK_BYTES)  # three full chunks and a bit


def test_a_chunked_restore_brings_back_the_backup_fenced_above_every_token():
    chunked = busy()
    outcomes = run(chunked, begin(BACKUP), *chunks(BACKUP), cmds.restore_commit(restore_id=ID, stamp_ms=22))
    assert len(outcomes) == 6 and all(isinstance(o, Applied) for o in outcomes), outcomes
    assert chunked.staged_restore_bytes is None
    loaded = FencingStateMachine()
    loaded.restore(BACKUP)  # the backup as it is: the snapshot-file path, unfenced
    assert outcomes[-1].result.to_map() == {"epoch": 100, "resources": loaded.resources_count}
    assert chunked.resources_count == loaded.resources_count
    assert chunked.keys_count == loaded.keys_count > 1
    assert chunked.describe("live") is None  # not in the backup: gone
    assert (chunked.epoch, chunked.log_clock_ms, chunked.dedup_size) == (100, 22, 0)
    for name, res in loaded._resources.items():
        assert chunked.describe(name) == {**loaded.describe(name), "hwm": 100, "lease": None}
        for key in res.data:
            assert chunked.read(name, key) == loaded.read(name, key)


def _refused_and_unchanged(sm, command, field_or_reason):
    before = sm.digest()
    out = sm.apply(command.encode())
    assert isinstance(out, Rejected), out
    assert field_or_reason in (out.details.get("field"), out.reason.name), out
    assert sm.digest() == before
    return out


@pytest.mark.parametrize("case", ["commit without begin", "chunk for an unknown restore",
                                  "chunk out of order", "chunk past the declared size",
                                  "commit short of the size", "bad digest", "backup past the limits",
                                  "floor not above the epoch", "second begin while staged"])
def test_a_crafted_chunked_restore_is_refused_and_changes_nothing(case):
    sm = busy()
    parts = chunks(BACKUP)
    commit = cmds.restore_commit(restore_id=ID, stamp_ms=22)
    if case == "commit without begin":
        _refused_and_unchanged(sm, commit, "restore_id")
    elif case == "chunk for an unknown restore":
        run(sm, begin(BACKUP))
        _refused_and_unchanged(sm, chunks(BACKUP, rid=OTHER)[0], "restore_id")
    elif case == "chunk out of order":
        run(sm, begin(BACKUP), parts[0])
        _refused_and_unchanged(sm, parts[2], "seq")
        _refused_and_unchanged(sm, parts[0], "seq")  # a chunk again
    elif case == "chunk past the declared size":
        run(sm, begin(BACKUP, size=10))
        _refused_and_unchanged(sm, parts[0], "chunk")
    elif case == "commit short of the size":
        run(sm, begin(BACKUP), *parts[:-1])
        _refused_and_unchanged(sm, commit, "size")
    elif case == "bad digest":
        run(sm, begin(BACKUP, digest=bytes(32)), *parts)
        _refused_and_unchanged(sm, commit, "digest")
    elif case == "backup past the limits":
        bad = msgpack.packb(["fencing-coordinator/state", 2, 5, 0, [["r", 5, 2**64 - 1, None, []]], [], None])
        run(sm, begin(bad), *chunks(bad))
        _refused_and_unchanged(sm, commit, "data")
    elif case == "floor not above the epoch":
        _refused_and_unchanged(sm, begin(BACKUP, floor=1), "EPOCH_FLOOR_TOO_LOW")
    elif case == "second begin while staged":
        run(sm, begin(BACKUP))
        _refused_and_unchanged(sm, begin(BACKUP, rid=OTHER), "LIMIT_EXCEEDED")
    assert sm.read("live", "k") == (None, 0) and sm.describe("live")["lease"] is not None
    # An abort drops whatever was staged; the next restore then goes through.
    run(sm, cmds.restore_abort(restore_id=ID, stamp_ms=23))
    assert sm.staged_restore_bytes is None
    outcomes = run(sm, begin(BACKUP, rid=OTHER, stamp=24), *chunks(BACKUP, rid=OTHER, stamp=24),
                   cmds.restore_commit(restore_id=OTHER, stamp_ms=24))
    assert all(isinstance(o, Applied) for o in outcomes), outcomes


def test_a_stale_staging_is_replaced_by_a_new_begin_and_dropped_by_a_tick():
    sm = busy()
    run(sm, begin(BACKUP), chunks(BACKUP)[0])
    idle = 21 + limits.RESTORE_STAGING_IDLE_MS
    _refused_and_unchanged(sm, begin(BACKUP, rid=OTHER, stamp=idle - 1), "LIMIT_EXCEEDED")
    assert isinstance(sm.apply(begin(BACKUP, rid=OTHER, stamp=idle).encode()), Applied)
    assert sm.staged_restore_bytes == 0
    assert isinstance(sm.apply(cmds.tick(stamp_ms=idle + limits.RESTORE_STAGING_IDLE_MS).encode()), Applied)
    assert sm.staged_restore_bytes is None


def test_the_staging_is_part_of_the_snapshot_and_a_restarted_member_finishes_alike():
    sm = busy()
    parts = chunks(BACKUP)
    run(sm, begin(BACKUP), *parts[:2])
    copy = FencingStateMachine()
    copy.restore(sm.snapshot())
    assert copy.digest() == sm.digest() and copy.staged_restore_bytes == 2 * limits.BACKUP_CHUNK_BYTES
    assert len(sm.backup()) < len(sm.snapshot())  # a backup never carries the staging
    for machine in (sm, copy):
        outcomes = run(machine, *parts[2:], cmds.restore_commit(restore_id=ID, stamp_ms=22))
        assert all(isinstance(o, Applied) for o in outcomes)
    assert copy.digest() == sm.digest()


def test_a_version_1_snapshot_still_loads():
    sm = busy()
    doc = msgpack.unpackb(sm.snapshot(), raw=False)
    assert doc[1] == snapshot_format.SNAPSHOT_FORMAT_VERSION and doc[6] is None  # nothing staged
    old = msgpack.packb([doc[0], 1, *doc[2:6]], use_bin_type=True)
    copy = FencingStateMachine()
    copy.restore(old)
    assert copy.digest() == sm.digest()
    with pytest.raises(ValueError, match="version 1 snapshot has 6 items"):
        copy.restore(msgpack.packb([doc[0], 1, *doc[2:7]], use_bin_type=True))


def test_snapshots_are_deferred_exactly_while_a_restore_is_staged():
    sm = busy()
    assert not sm.snapshot_deferred
    run(sm, begin(BACKUP), chunks(BACKUP)[0])
    assert sm.snapshot_deferred
    run(sm, cmds.restore_abort(restore_id=ID, stamp_ms=22))
    assert not sm.snapshot_deferred
    run(sm, begin(BACKUP, stamp=23), *chunks(BACKUP, stamp=23))
    assert sm.snapshot_deferred
    assert isinstance(run(sm, cmds.restore_commit(restore_id=ID, stamp_ms=24))[0], Applied)
    assert not sm.snapshot_deferred
    run(sm, begin(BACKUP, rid=OTHER, stamp=25))
    run(sm, cmds.tick(stamp_ms=25 + limits.RESTORE_STAGING_IDLE_MS))  # stale: dropped
    assert not sm.snapshot_deferred


def test_an_item_the_reader_fails_on_is_a_refusal_at_the_commit_never_a_raise(monkeypatch):
    """Should an item get past every check and still make reading fail, the chunks stage as
    usual, a member's snapshot taken meanwhile still loads (it reads them again), and the
    COMMIT refuses the backup: nothing raises on the Raft thread."""
    from coordinator.core import snapshot_format

    read_resource = snapshot_format._read_resource

    def broken(item, *args):
        if item[0].startswith("big/"):  # the backup's resources, not the member's own
            raise TypeError("boom")
        return read_resource(item, *args)

    monkeypatch.setattr(snapshot_format, "_read_resource", broken)
    sm = busy()
    outcomes = run(sm, begin(BACKUP), *chunks(BACKUP))
    assert all(isinstance(o, Applied) for o in outcomes), outcomes
    copy = FencingStateMachine()
    copy.restore(sm.snapshot())
    for machine in (sm, copy):
        before = machine.digest()
        out = machine.apply(cmds.restore_commit(restore_id=ID, stamp_ms=22).encode())
        assert isinstance(out, Rejected) and out.details == {"field": "data"}, out
        assert "reading it failed (TypeError: boom)" in out.message
        assert machine.digest() == before
