"""A follower that sees its leader's connection close stands for election within a few
heartbeats, not after its whole election timeout.

A leader whose process dies (SIGKILL, a crash, an exit) has its connections closed by the
kernel, and its followers see that at once; pysyncobj still waited out the election timeout
(1-2 s by default) from the last heartbeat, so a crashed leader cost 1-2 s of NO_LEADER.
``leader_lost_election_s`` moves the follower's election to 1-2x that setting after the close
(coordinator/raft/RAFT.md, "A closed leader connection").

The leader here is a fake member (testsupport.raft_peer.RaftPeer) that makes itself the node's
leader with one append; a second fake member is connected too, so the node has someone to ask
for a vote. The node's election timeout is far longer than the test, so a vote request within
the test can only come from the closed connection.
"""

from __future__ import annotations

import time

import pytest

from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft.node import RaftConfig, RaftNode
from testsupport.raft_peer import RaftPeer, connected_to
from testsupport.supervisor import pick_ports, wait_until

NO_ELECTION_S = 60.0  # the node's election timeout: never reached here
VOTE_WAIT_S = 10.0  # far above 2 x LOST_S, far below NO_ELECTION_S
LOST_S = 0.3


def _lead(peer: RaftPeer, node: RaftNode, term: int) -> None:
    last = node.syncobj._SyncObj__raftLog[-1]
    peer.send(peer.frame({"type": "append_entries", "term": term, "commit_index": 0,
                          "prevLogIdx": last[1], "prevLogTerm": last[2], "entries": (),
                          "cluster": None, "incarnation": 42}))  # who sends it (member_gate.py)


def _vote_request(peer: RaftPeer, timeout_s: float):
    """The first request_vote the node sends ``peer`` within ``timeout_s``, else None."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        message = peer.receive(left)
        if isinstance(message, dict) and message.get("type") == "request_vote":
            return message
    return None


@pytest.fixture
def make_follower(tmp_path):
    """make(lost_s) -> (node, leader address, leader peer, other peer, the leader's term): the
    node follows the fake leader and is connected to a second fake member too."""
    made = []

    def make(lost_s: float):
        port, _ = pick_ports(("127.0.0.2",))
        # Both fake members' addresses are above the node's: members dial lower addresses only.
        leader_address, other_address = f"127.0.0.3:{port}", f"127.0.0.4:{port}"
        config = RaftConfig(f"127.0.0.2:{port}", (leader_address, other_address), str(tmp_path / "n"),
                            raft_min_timeout_s=NO_ELECTION_S, raft_max_timeout_s=2 * NO_ELECTION_S,
                            leader_lost_election_s=lost_s)
        node = RaftNode(config, FencingStateMachine())
        made.append(node)
        wait_until(node.listening, 10, what="the node to listen")
        leader = RaftPeer(config.self_address).name(leader_address)
        other = RaftPeer(config.self_address).name(other_address)
        made.extend((leader, other))
        term = node.syncobj._SyncObj__raftLog[-1][2] + 1
        _lead(leader, node, term)
        wait_until(lambda: node.leader_address() == leader_address, 10, what="the fake member to lead")
        return node, leader_address, leader, other, term

    yield make
    for item in reversed(made):
        item.close()


def test_a_closed_leader_connection_starts_an_election_soon(make_follower):
    node, leader_address, leader, other, term = make_follower(LOST_S)
    leader.close()  # the leader's process is gone: its end of the connection closes
    vote = _vote_request(other, VOTE_WAIT_S)
    assert vote is not None, f"no election within {VOTE_WAIT_S} s of the leader's connection closing"
    assert vote["term"] == term + 1


def test_off_it_waits_for_the_election_timeout(make_follower):
    node, leader_address, leader, other, term = make_follower(0)
    leader.close()
    wait_until(lambda: not connected_to(node, leader_address), 10, what="the node to see the connection go")
    assert _vote_request(other, 4 * (2 * LOST_S)) is None  # four times the latest it would have stood
    assert node.leader_address() == leader_address


def test_a_leader_back_within_the_window_keeps_leading(make_follower):
    """A connection that merely dropped: the leader dials again and its next heartbeat resets the
    node's timer before the shortened deadline, so nobody stands."""
    lost_s = 1.0  # wide, so the reconnect below lands inside it on a loaded machine
    node, leader_address, leader, other, term = make_follower(lost_s)
    leader.close()
    again = RaftPeer(node.syncobj._SyncObj__selfNode.address).name(leader_address)
    try:
        # The new connection's first append may be handled before the old one's close: keep
        # heartbeating as a leader does, for three windows.
        until = time.monotonic() + 3 * lost_s
        while time.monotonic() < until:
            _lead(again, node, term)
            assert _vote_request(other, 0.1) is None
        assert node.leader_address() == leader_address
    finally:
        again.close()
