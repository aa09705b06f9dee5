"""The read-index fields of the typed wire (coordinator/raft/wire.py ``_TRAILING``): optional,
absent by default, byte-identical frames without them, and refused whole when mistyped."""

from __future__ import annotations

import msgpack
import pytest

from coordinator.raft import limits as raft_limits
from coordinator.raft import wire as raft_wire

SENDER = {"cluster": "c1", "incarnation": 7}
APPEND = {"type": "append_entries", "term": 3, "commit_index": 5, "prevLogIdx": 5, "prevLogTerm": 3,
          "entries": (), **SENDER}
CHUNK = {"type": "append_entries", "term": 3, "commit_index": 5, "serialized": None, **SENDER}
ACK = {"type": "next_node_idx", "next_node_idx": 6, "reset": False, "success": True, **SENDER}
BAD_INTS = [-1, raft_limits.RAFT_WIRE_INT_END, 1.0, True, "1", b"\x01", None, (1,)]


def frame_fields(message) -> list:
    return msgpack.unpackb(raft_wire.encode_frame(message), use_list=True, raw=False)


@pytest.mark.parametrize("message", [APPEND, CHUNK, ACK], ids=["append", "chunk", "ack"])
def test_without_the_fields_a_frame_is_the_old_one_and_decodes_without_them(message):
    fields = frame_fields(message)
    assert len(fields) == 3 + len(raft_wire._SCHEMAS[fields[1]][1])  # no trailing field at all
    decoded = raft_wire.decode_frame(raft_wire.encode_frame(message))
    assert "read_seq" not in decoded and "read_term" not in decoded


@pytest.mark.parametrize(
    "message, extra",
    [(APPEND, {"read_seq": 9}), (CHUNK, {"read_seq": 9}), (ACK, {"read_term": 3, "read_seq": 9})],
    ids=["append", "chunk", "ack"],
)
def test_with_the_fields_they_round_trip(message, extra):
    decoded = raft_wire.decode_frame(raft_wire.encode_frame({**message, **extra}))
    for name, value in extra.items():
        assert decoded[name] == value


@pytest.mark.parametrize("bad", BAD_INTS, ids=repr)
@pytest.mark.parametrize(
    "message, field",
    [(APPEND, "read_seq"), (CHUNK, "read_seq"), (ACK, "read_seq"), (ACK, "read_term")],
    ids=["append", "chunk", "ack-seq", "ack-term"],
)
def test_a_mistyped_field_refuses_the_whole_frame(message, field, bad):
    fields = frame_fields(message)
    names = ("read_term", "read_seq") if message is ACK else ("read_seq",)
    fields += [bad if name == field else 1 for name in names]
    with pytest.raises(raft_wire.PeerMessageRefused):
        raft_wire.decode_frame(msgpack.packb(fields, use_bin_type=True))


def test_an_acknowledgement_carries_both_fields_or_neither():
    fields = frame_fields(ACK)
    with pytest.raises(raft_wire.PeerMessageRefused):
        raft_wire.decode_frame(msgpack.packb(fields + [3], use_bin_type=True))  # one of two
    with pytest.raises(raft_wire.PeerMessageRefused):
        raft_wire.decode_frame(msgpack.packb(fields + [3, 4, 5], use_bin_type=True))  # one too many
    with pytest.raises(ValueError):
        raft_wire.encode_frame({**ACK, "read_seq": 4})  # our own bug: never sent half


@pytest.mark.parametrize("message", [
    {"type": "request_vote", "term": 1, "last_log_index": 1, "last_log_term": 1, **SENDER},
    {"type": "response_vote", "term": 1, **SENDER},
    {"type": "timeout_now", "term": 1},
], ids=["request_vote", "response_vote", "timeout_now"])
def test_kinds_without_trailing_fields_still_refuse_an_extra_one(message):
    fields = frame_fields(message)
    with pytest.raises(raft_wire.PeerMessageRefused):
        raft_wire.decode_frame(msgpack.packb(fields + [1], use_bin_type=True))
