"""The largest state the limits allow has a size, and a backup of it stays under BACKUP_BYTES_MAX.

In-process (the state machine alone): the fullest state is built as a backup document
(``testsupport.backups.fullest_backup``), loaded and written back by the state machine, and
measured; the cluster-wide stored-bytes and key-count limits refuse a write past them and
change nothing. tests/test_backup_stream.py restores the same backup on real processes.
"""

from __future__ import annotations

import hashlib
import time

import msgpack
import pytest

from coordinator.core import commands as cmds
from coordinator.core import limits
from coordinator.core.commands import Op
from coordinator.core.outcomes import Applied, Rejected, outcome_to_wire
from coordinator.core.results import result_from_map
from coordinator.core.state_machine import FencingStateMachine
from testsupport.backups import BIG, fullest_backup, restore_in_chunks


def test_the_fullest_state_the_limits_allow_writes_a_backup_under_backup_bytes_max():
    started = time.perf_counter()
    backup = fullest_backup()
    built_s = time.perf_counter() - started
    sm = FencingStateMachine()
    sm.check_backup(backup)  # a restore would accept it: it is within every limit
    started = time.perf_counter()
    sm.restore(backup)
    loaded_s = time.perf_counter() - started
    assert (sm.resources_count, sm.keys_count, sm.dedup_size) == (
        limits.RESOURCES_MAX, limits.STATE_KEYS_MAX, limits.DEDUP_ENTRIES_MAX)
    assert sm.stored_bytes == limits.STATE_STORED_BYTES_MAX
    written = sm.backup()
    assert written == backup  # canonical: the state machine writes the same bytes back
    print(f"fullest backup: {len(written):,} bytes, bound {limits.BACKUP_BYTES_MAX:,};"
          f" built in {built_s:.1f} s, loaded in {loaded_s:.1f} s")
    assert len(written) <= limits.BACKUP_BYTES_MAX
    # The bound is close, not merely safe (its slack: every msgpack head counted at 5 bytes).
    assert len(written) >= 0.9 * limits.BACKUP_BYTES_MAX

    # Through the log, as a member applies it: each entry is a Raft-thread pause (printed).
    staged = FencingStateMachine()
    rid = b"r" * limits.RESTORE_ID_BYTES
    entries = [cmds.restore_begin(restore_id=rid, size=len(backup), digest=hashlib.sha256(backup).digest(),
                                  epoch_floor=BIG + 10, stamp_ms=1)]
    entries += [cmds.restore_chunk(restore_id=rid, seq=n, chunk=backup[o:o + limits.BACKUP_CHUNK_BYTES], stamp_ms=1)
                for n, o in enumerate(range(0, len(backup), limits.BACKUP_CHUNK_BYTES))]
    entries.append(cmds.restore_commit(restore_id=rid, stamp_ms=1))
    pauses = []
    for entry in (e.encode() for e in entries):
        started = time.perf_counter()
        out = staged.apply(entry)
        pauses.append(time.perf_counter() - started)
        assert isinstance(out, Applied), out
    print(f"restored in {len(entries)} entries: {sum(pauses):.1f} s in all, slowest chunk"
          f" {max(pauses[1:-1]) * 1000:.0f} ms, commit {pauses[-1] * 1000:.0f} ms")
    assert (staged.resources_count, staged.keys_count, staged.dedup_size) == (
        limits.RESOURCES_MAX, limits.STATE_KEYS_MAX, 0)
    assert staged.stored_bytes == limits.STATE_STORED_BYTES_MAX


@pytest.mark.parametrize("op, result", [
    (Op.ACQUIRE, {"token": BIG, "expires_at_ms": BIG, "hwm": BIG}),
    (Op.WRITE, {"version": BIG, "hwm": BIG}),
    (Op.DELETE, {"version": BIG, "deleted": True}),
    (Op.RELEASE, {"hwm": BIG, "released": True}),
    (Op.FORCE_RELEASE, {"hwm": BIG}),
])
def test_every_ops_largest_stored_outcome_fits_its_bound(op, result):
    packed = msgpack.packb(outcome_to_wire(Applied(op=op, result=result_from_map(op, result))), use_bin_type=True)
    assert len(packed) <= limits.SNAPSHOT_DEDUP_OUTCOME_BYTES_MAX


def _machine_with_lease(**config) -> tuple[FencingStateMachine, int]:
    sm = FencingStateMachine(**config)
    out = sm.execute(cmds.acquire(resource="r", holder="h", ttl_ms=60_000, op_id=b"a" * 16, stamp_ms=1))
    assert isinstance(out, Applied)
    return sm, out.result.token


def _write(sm, token, key, value, n):
    return sm.execute(cmds.write(resource="r", key=key, value=value, token=token,
                                 op_id=bytes([n]) * 16, stamp_ms=2))


def test_a_write_past_the_cluster_stored_bytes_limit_is_refused_and_changes_nothing():
    sm, token = _machine_with_lease(state_stored_bytes_max=100)
    assert isinstance(_write(sm, token, "k", b"x" * 90, 1), Applied)  # 1 + 90 bytes
    before = sm.digest()
    out = _write(sm, token, "k2", b"x" * 8, 2)  # 91 + 2 + 8 = 101 > 100
    assert isinstance(out, Rejected) and out.reason.name == "LIMIT_EXCEEDED"
    assert out.details == {"limit": "state_stored_bytes", "max": 100}
    assert sm.digest() == before and sm.stored_bytes == 91
    # Shrinking a value is always allowed, and frees room.
    assert isinstance(_write(sm, token, "k", b"x", 3), Applied)
    assert isinstance(_write(sm, token, "k2", b"x" * 8, 4), Applied)
    assert sm.stored_bytes == 2 + 10


def test_a_new_key_past_the_cluster_key_limit_is_refused_but_an_existing_key_is_rewritten():
    sm, token = _machine_with_lease(state_keys_max=2)
    assert isinstance(_write(sm, token, "a", b"1", 1), Applied)
    assert isinstance(_write(sm, token, "b", b"1", 2), Applied)
    before = sm.digest()
    out = _write(sm, token, "c", b"1", 3)
    assert isinstance(out, Rejected) and out.details == {"limit": "state_keys", "max": 2}
    assert sm.digest() == before
    assert isinstance(_write(sm, token, "a", b"2", 4), Applied)
    out = sm.execute(cmds.delete(resource="r", key="a", token=token, op_id=b"d" * 16, stamp_ms=3))
    assert isinstance(out, Applied) and sm.keys_count == 1
    assert isinstance(_write(sm, token, "c", b"1", 5), Applied)


def test_a_backup_past_the_cluster_limits_is_refused_whole():
    sm, token = _machine_with_lease()
    for n, key in enumerate("abc"):
        assert isinstance(_write(sm, token, key, b"x" * 10, n + 1), Applied)
    backup = sm.backup()
    for config, words in (({"state_keys_max": 2}, "keys: 3, more than 2"),
                          ({"state_stored_bytes_max": 32}, "stored bytes (keys + values): 33, more than 32")):
        small = FencingStateMachine(**config)
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
            small.check_backup(backup)
        out = restore_in_chunks(small, backup, epoch_floor=10, stamp_ms=5)
        assert isinstance(out, Rejected) and out.details == {"field": "data"}
        assert small.epoch == 0
