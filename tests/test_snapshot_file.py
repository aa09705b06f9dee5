"""The snapshot file read back (coordinator/raft/snapshot_file.py): checked, and without copies.

Found by tests/test_raft_memory.py failing in CI (a restarted member peaked at 261 MiB against
a bound of 228): loading a 40 MB snapshot held the file read whole to verify it, then the file
read whole again, its body sliced off (a copy), and the state unpacked from it (a third copy),
besides the state machine built from it. Verifying now streams the file, and the state comes
back as a view into the file's bytes.
"""

from __future__ import annotations

import os
import tracemalloc

import msgpack
import pytest

from coordinator.raft import snapshot_file

MIB = 1024 * 1024
LAST = (b"last-command", 41, 3)
PREV = (b"", 40, 3)
CONFIG = {"members": ["a", "b", "c"]}


def written(tmp_path, state, *, last=LAST, config=CONFIG) -> str:
    path = str(tmp_path / snapshot_file.DUMP_NAME)
    snapshot_file.write(path, last, PREV, state, config)
    return path


@pytest.mark.parametrize("state", [b"", b"x", bytes(255), bytes(256), bytes(70_000)])
def test_a_state_of_bytes_comes_back_as_a_view_into_the_file_not_a_copy(tmp_path, state):
    body = snapshot_file.read_body(written(tmp_path, state))
    last, prev, got, config = snapshot_file.decode(body)
    assert (last, prev, config) == (LAST, PREV, CONFIG)
    assert isinstance(got, memoryview) and got.obj is body.obj
    assert bytes(got) == state


@pytest.mark.parametrize("state", [[1, 2, b"x"], {"a": 1}, None, 7, "text"])
def test_any_other_state_is_unpacked(tmp_path, state):
    assert snapshot_file.decode(snapshot_file.read_body(written(tmp_path, state)))[2:] == (state, CONFIG)


def test_entries_larger_than_one_read_of_the_head_are_found(tmp_path):
    # The head is fed 64 KiB at a time until the two entries before the state are whole.
    last = (os.urandom(200_000), 9, 2)
    path = written(tmp_path, b"state", last=last, config=None)
    got = snapshot_file.decode(snapshot_file.read_body(path))
    assert (got[0], got[1], bytes(got[2]), got[3]) == (last, PREV, b"state", None)


def test_a_body_of_three_parts_has_no_configuration():
    # Snapshots written before configurations were recorded.
    body = msgpack.packb([list(LAST), list(PREV), b"state"], use_bin_type=True)
    last, prev, state, config = snapshot_file.decode(body)
    assert (last, prev, bytes(state), config) == (LAST, PREV, b"state", None)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        msgpack.packb([list(LAST)], use_bin_type=True),  # ends before its state
        msgpack.packb([list(LAST), list(PREV)], use_bin_type=True),  # two parts
        msgpack.packb([1, 2, 3, 4, 5], use_bin_type=True),  # five parts
        msgpack.packb([list(LAST), list(PREV), b"state", None], use_bin_type=True)[:-3],  # cut in the state
        msgpack.packb([list(LAST), list(PREV), bytes(300), None], use_bin_type=True)[:-303],  # cut in its header
    ],
)
def test_a_body_that_is_not_a_snapshot_is_refused(body):
    with pytest.raises(ValueError):
        snapshot_file.decode(body)


def test_a_damaged_file_is_refused_by_verify_and_by_read_body(tmp_path):
    path = written(tmp_path, bytes(1000))
    raw = bytearray(open(path, "rb").read())
    raw[-10] ^= 1
    open(path, "wb").write(raw)
    for read in (snapshot_file.verify, snapshot_file.read_body):
        with pytest.raises(ValueError, match="checksum"):
            read(path)
    open(path, "wb").write(raw[:10])
    for read in (snapshot_file.verify, snapshot_file.read_body):
        with pytest.raises(ValueError, match="shorter than its header"):
            read(path)


def test_verifying_and_loading_hold_the_file_once_at_most(tmp_path):
    state = os.urandom(24 * MIB)
    path = written(tmp_path, state)
    size = os.path.getsize(path)
    del state
    tracemalloc.start()
    try:
        assert snapshot_file.verify(path) == (LAST[1], LAST[2])
        _, verify_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        body = snapshot_file.read_body(path)
        parts = snapshot_file.decode(body)
        _, load_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(parts[2]) == 24 * MIB
    # Verify: two read buffers (the next is read while the last is still held), never the file.
    # Load: the file once (it was held three times over).
    assert verify_peak < 3 * MIB, f"verifying peaked at {verify_peak / MIB:.1f} MiB"
    assert load_peak < size + 4 * MIB, f"loading a {size / MIB:.0f} MiB file peaked at {load_peak / MIB:.1f} MiB"
