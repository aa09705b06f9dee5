"""The proposer's one path: ``propose(c)`` is ``propose_many([c])[0]``, raised when an error.

A stand-in node answers every proposal with one fate and records what reached it. Each test
shows one rule of the path holding for one command and for many alike: the stamp, the size
cap (raised only by ``max_bytes``), the in-flight slots (and the member's own jobs outside
them), and a fate other than APPLIED turned into its ServiceError.
"""

from __future__ import annotations

import types

import msgpack
import pytest

from coordinator.core import limits, ops
from coordinator.core.names import ErrorReason as R
from coordinator.raft.interface import ProposeFailure, ProposeOutcome, ProposeResult
from coordinator.server.errors import ServiceError
from coordinator.server.proposer import Proposer

LEADER, LEADER_API = "10.0.0.2:7000", "10.0.0.2:9000"
STAMP_MS = 1_234
APPLIED = ProposeResult(ProposeOutcome.APPLIED, value=types.SimpleNamespace(result={"ok": 1}), index=3)


class _Node:
    """Answers each proposal with ``fate``, through whichever call the proposer makes."""

    def __init__(self, fate: ProposeResult = APPLIED) -> None:
        self.fate = fate
        self.sent: list[list] = []  # each command as proposed: [version, op, stamp_ms, body]

    def next_stamp_ms(self) -> int:
        return STAMP_MS

    def propose(self, command: bytes, timeout_s: float, *, batch_key=None, max_bytes=None) -> ProposeResult:
        self.sent.append(msgpack.unpackb(command))
        return self.fate

    def propose_async_result(self, command: bytes, on_result, *, batch_key=None) -> None:
        on_result(self.propose(command, 0.0))

    def leader_address(self) -> str:
        return LEADER


def _proposer(node: _Node, inflight_max: int = 4) -> Proposer:
    return Proposer(node, inflight_max=inflight_max, timeout_max_s=5.0, deadline_margin_s=0.1,
                    members={LEADER: LEADER_API})


def _write(value: bytes = b"v") -> ops.Write:
    return ops.Write(resource="r", key="k", value=value, token=1, op_id=b"o" * 16)


def _chunk(size: int) -> ops.RestoreChunk:
    """A restore's chunk: the one body whose fields may take it past COMMAND_BYTES_MAX (a
    Write cannot: VALUE_BYTES_MAX leaves room for its other fields)."""
    return ops.RestoreChunk(restore_id=b"r" * 16, seq=0, chunk=b"x" * size)


def test_every_command_is_stamped_once_whether_alone_or_in_a_batch():
    node = _Node()
    proposer = _proposer(node)
    assert proposer.propose(_write(), 1.0) is APPLIED
    assert proposer.propose_many([_write(), _write()], 1.0) == [APPLIED, APPLIED]
    assert [stamp_ms for _, _, stamp_ms, _ in node.sent] == [STAMP_MS] * 3


def test_a_command_over_the_cap_is_refused_before_the_node_alone_or_in_a_batch():
    node = _Node()
    proposer = _proposer(node)
    big = _chunk(limits.COMMAND_BYTES_MAX)
    with pytest.raises(ServiceError) as alone:
        proposer.propose(big, 1.0)
    assert alone.value.reason == R.LIMIT_EXCEEDED
    too_large, small = proposer.propose_many([big, _write()], 1.0)
    assert isinstance(too_large, ServiceError) and too_large.reason == R.LIMIT_EXCEEDED
    assert small is APPLIED
    assert [body["value"] for _, _, _, body in node.sent] == [b"v"]
    # The chunk entry is under the cap its caller (a restore) gives.
    assert proposer.propose(big, 1.0, max_bytes=limits.RESTORE_CHUNK_COMMAND_BYTES_MAX) is APPLIED
    largest_write = _write(b"x" * limits.VALUE_BYTES_MAX)  # with the longest name, key and op_id too
    largest_write = ops.Write(resource="r" * limits.RESOURCE_NAME_BYTES_MAX, key="k" * limits.KEY_BYTES_MAX,
                              value=largest_write.value, token=limits.TOKEN_MAX, op_id=b"o" * limits.OP_ID_BYTES_MAX,
                              principal="p" * limits.PRINCIPAL_NAME_BYTES_MAX,
                              quota={"stored_bytes": limits.QUOTA_VALUE_MAX, "dedup_entries": limits.QUOTA_VALUE_MAX})
    assert proposer.propose(largest_write, 1.0) is APPLIED
    assert len(node.sent) == 3


def test_no_slot_left_is_overloaded_but_the_members_own_jobs_still_propose():
    node = _Node()
    proposer = _proposer(node, inflight_max=1)
    assert proposer._slots.acquire(blocking=False)  # a client's proposal in flight
    with pytest.raises(ServiceError) as alone:
        proposer.propose(_write(), 1.0)
    assert alone.value.reason == R.OVERLOADED
    assert [a.reason for a in proposer.propose_many([_write(), _write()], 1.0)] == [R.OVERLOADED] * 2
    assert node.sent == []
    assert proposer.propose(ops.Tick(), 1.0, client_slot=False) is APPLIED
    proposer._slots.release()
    for _ in range(2):  # each call gives its slot back, whatever its fate
        assert proposer.propose(_write(), 1.0) is APPLIED
        assert proposer.propose_many([_write()], 1.0) == [APPLIED]


def test_a_lost_leader_is_the_same_service_error_alone_or_in_a_batch():
    proposer = _proposer(_Node(ProposeResult.failed(ProposeFailure.NO_LEADER)))
    with pytest.raises(ServiceError) as alone:
        proposer.propose(_write(), 1.0)
    (in_batch,) = proposer.propose_many([_write()], 1.0)
    for error in (alone.value, in_batch):
        assert error.reason == R.NO_LEADER
        assert (error.metadata["leader"], error.metadata["leader_api"]) == (LEADER, LEADER_API)
