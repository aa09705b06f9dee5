"""A follower whose connection to the leader is gone answers proposals at once, and truthfully.

pysyncobj keeps a leader it cannot reach until its election timeout fires: a command it
"forwarded" meanwhile was dropped unsent, and one forwarded before the connection dropped
waited for an answer that could no longer come, both until the next election or the caller's
deadline (1-2 s of 'outcome unknown' in a failover). Now an unsent command is NO_LEADER (nothing
can apply it) and one sent before the drop is UNKNOWN (LEADER_CHANGED: it may still apply),
both as soon as the follower sees the connection go.

The leader here is a fake member (testsupport.raft_peer.RaftPeer) that makes itself the
node's leader with one append and never answers a forwarded command; the node's election
timeout is far longer than the test, so no election can answer in its place.
"""

from __future__ import annotations

import threading

import pytest

from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft.interface import ProposeFailure, ProposeOutcome
from coordinator.raft.node import RaftConfig, RaftNode
from testsupport.raft_peer import RaftPeer, connected_to
from testsupport.supervisor import pick_ports, wait_until

# Longer than any wait below, so an answer never comes from an election, and longer than a
# test without the fix takes to fail (a proposal then ends at its deadline).
NO_ELECTION_S = 60.0
PROPOSE_TIMEOUT_S = 10.0
COMMAND = b"\x91\x00"  # never applied: the fake leader appends nothing


@pytest.fixture
def follower(tmp_path):
    """(node, fake leader's address, a connected RaftPeer that leads the node)."""
    port, _ = pick_ports(("127.0.0.2",))
    # The fake leader's address is above the node's: members dial lower addresses only.
    leader_address = f"127.0.0.3:{port}"
    config = RaftConfig(f"127.0.0.2:{port}", (leader_address, f"127.0.0.4:{port}"), str(tmp_path / "n"),
                        raft_min_timeout_s=NO_ELECTION_S, raft_max_timeout_s=2 * NO_ELECTION_S)
    node = RaftNode(config, FencingStateMachine())
    wait_until(node.listening, 10, what="the node to listen")
    so = node.syncobj
    last = so._SyncObj__raftLog[-1]
    peer = RaftPeer(config.self_address).name(leader_address)
    peer.send(peer.frame({"type": "append_entries", "term": last[2] + 1, "commit_index": 0,
                          "prevLogIdx": last[1], "prevLogTerm": last[2], "entries": (),
                          "cluster": None, "incarnation": 42}))  # who sends it (member_gate.py)
    wait_until(lambda: node.leader_address() == leader_address, 10, what="the fake member to lead")
    try:
        yield node, leader_address, peer
    finally:
        peer.close()
        node.close()


def test_a_command_forwarded_before_the_leader_went_is_unknown_at_once(follower):
    node, leader_address, peer = follower
    results = []
    proposing = threading.Thread(target=lambda: results.append(node.propose(COMMAND, PROPOSE_TIMEOUT_S)))
    proposing.start()
    wait_until(lambda: node.syncobj._SyncObj__commandsWaitingReply, 10, what="the command forwarded")
    peer.close()  # the leader's process is gone: its end of the connection closes
    proposing.join(PROPOSE_TIMEOUT_S + 5)
    assert len(results) == 1
    assert results[0].outcome is ProposeOutcome.UNKNOWN
    assert results[0].failure is ProposeFailure.LEADER_CHANGED  # not DEADLINE_EXCEEDED: it did not wait


def test_a_command_for_a_leader_out_of_reach_is_refused_unsent(follower):
    node, leader_address, peer = follower
    peer.close()
    wait_until(lambda: not connected_to(node, leader_address), 10, what="the node to see the connection go")
    assert node.leader_address() == leader_address  # no election yet: pysyncobj would forward
    result = node.propose(COMMAND, PROPOSE_TIMEOUT_S)
    assert result.outcome is ProposeOutcome.NOT_APPLIED
    assert result.failure is ProposeFailure.NO_LEADER
